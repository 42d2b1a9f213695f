//! The values of `confine run`'s and `confine exec`'s flags: sizes,
//! counts, CPU shares, durations and users, each with the error that tells
//! the user what to give instead. One grammar per kind of value, shared by
//! every flag that takes it.

use std::time::Duration;

/// A limit as given on the command line: a value, or lifted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limit<T> {
    Value(T),
    Unlimited,
}

impl<T: Copy> Limit<T> {
    /// The limit in force: the given one, else the configured default.
    pub(crate) fn or_default(arg: Option<Limit<T>>, default: T) -> Option<T> {
        match arg {
            Some(Limit::Value(v)) => Some(v),
            Some(Limit::Unlimited) => None,
            None => Some(default),
        }
    }
}

/// Why a flag's value was refused (clap prints it after the flag).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    #[error("invalid size '{0}': use a number with an optional K, M, G or T suffix, e.g. 256M")]
    Size(String),
    #[error("memory limit '{0}' is too small: the sandbox itself needs a few MiB; use at least 4M")]
    MemoryTooSmall(String),
    #[error("invalid process count '{0}': give a whole number of at least 1, or unlimited")]
    Pids(String),
    #[error("invalid CPU count '{given}': give cores between 0.01 and {online}, e.g. 0.5, or unlimited")]
    Cpus { given: String, online: usize },
    #[error("--tmp-size '{0}' must be more than 0")]
    ZeroTmpSize(String),
    #[error("invalid duration '{0}': use a number with ms, s, m or h, e.g. 30s")]
    Duration(String),
    #[error("duration '{0}' must be more than 0")]
    ZeroDuration(String),
    #[error("no user '{0}' in the sandbox's /etc/passwd; give a number (any uid works inside)")]
    NoUser(String),
    #[error("/etc/passwd gives '{0}' no numeric uid")]
    NoNumericUid(String),
    #[error("no group '{0}' in the sandbox's /etc/group; give a number")]
    NoGroup(String),
    /// `(uid_t)-1` means "unchanged" to the id syscalls.
    #[error("4294967295 is not a valid id")]
    ReservedId,
    #[error(
        "invalid hostname '{0}': use letters, digits and '-' (not first or last) in dot-separated labels of \
         1 to 63 characters, at most {HOST_NAME_MAX} in all, e.g. build-1"
    )]
    Hostname(String),
}

/// A value parser that offers `values` to completion scripts (`confine
/// completions`) and leaves the checking to `inner`: `--runtime` is
/// checked, and refused with the list, by the pipeline that audits it, and
/// `--net allow:` goes on with hosts no list can hold.
#[derive(Clone)]
pub(crate) struct Suggest<P> {
    inner: P,
    values: &'static [&'static str],
}

impl<P> Suggest<P> {
    pub(crate) fn new(inner: P, values: &'static [&'static str]) -> Suggest<P> {
        Suggest { inner, values }
    }
}

impl<P: clap::builder::TypedValueParser> clap::builder::TypedValueParser for Suggest<P> {
    type Value = P::Value;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Self::Value, clap::Error> {
        self.inner.parse_ref(cmd, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        Some(Box::new(self.values.iter().map(|v| clap::builder::PossibleValue::new(*v))))
    }
}

/// What completion offers for `--runtime`.
pub(crate) fn runtime_names() -> Suggest<clap::builder::StringValueParser> {
    Suggest::new(clap::builder::StringValueParser::new(), &crate::runtimes::NAMES)
}

/// `--net`'s own parser.
type ParseNetwork = fn(&str) -> Result<crate::job::Network, crate::job::NetworkArgError>;

/// What completion offers for `--net`: the modes (`allow:` goes on with hosts).
pub(crate) fn network_modes() -> Suggest<ParseNetwork> {
    Suggest::new(crate::job::Network::parse_arg, &["none", "host", "allow:"])
}

fn unlimited<T>(s: &str, parse: impl Fn(&str) -> Result<T, ArgError>) -> Result<Limit<T>, ArgError> {
    if s.trim().eq_ignore_ascii_case("unlimited") {
        Ok(Limit::Unlimited)
    } else {
        parse(s).map(Limit::Value)
    }
}

/// `--user UID[:GID]`, names looked up in the files the sandbox shows
/// (the host's /etc/passwd and /etc/group, bound read-only).
pub(crate) fn parse_user(s: &str) -> Result<(u32, u32), ArgError> {
    user_ids(
        s,
        &std::fs::read_to_string("/etc/passwd").unwrap_or_default(),
        &std::fs::read_to_string("/etc/group").unwrap_or_default(),
    )
}

fn user_ids(s: &str, passwd: &str, group: &str) -> Result<(u32, u32), ArgError> {
    // name:x:uid:gid:… (passwd) and name:x:gid:… (group).
    let entry = |db: &str, key: &dyn Fn(&[&str]) -> bool| -> Option<Vec<String>> {
        db.lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .find(|f| f.len() >= 3 && key(f))
            .map(|f| f.iter().map(|s| s.to_string()).collect())
    };
    let (user, grp) = match s.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (s, None),
    };
    let (uid, passwd_gid) = match user.parse::<u32>() {
        Ok(uid) => (uid, entry(passwd, &|f| f[2] == user).and_then(|f| f.get(3).and_then(|g| g.parse().ok()))),
        Err(_) => {
            let f = entry(passwd, &|f| f[0] == user).ok_or_else(|| ArgError::NoUser(user.to_string()))?;
            let uid = f[2].parse().map_err(|_| ArgError::NoNumericUid(user.to_string()))?;
            (uid, f.get(3).and_then(|g| g.parse().ok()))
        }
    };
    let gid = match grp {
        None => passwd_gid.unwrap_or(0),
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => entry(group, &|f| f[0] == g)
                .and_then(|f| f[2].parse().ok())
                .ok_or_else(|| ArgError::NoGroup(g.to_string()))?,
        },
    };
    if uid == u32::MAX || gid == u32::MAX {
        return Err(ArgError::ReservedId);
    }
    Ok((uid, gid))
}

/// The longest hostname a UTS namespace holds (`__NEW_UTS_LEN`).
const HOST_NAME_MAX: usize = 64;

/// `--hostname`: RFC 1123 labels (letters, digits, `-` inside), and no
/// longer than the kernel keeps, so that a name `sethostname` would
/// refuse or one a job's tools would choke on is a usage error here, not
/// a failed start.
pub(crate) fn parse_hostname(s: &str) -> Result<String, ArgError> {
    let label_ok = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if s.is_empty() || s.len() > HOST_NAME_MAX || !s.split('.').all(label_ok) {
        return Err(ArgError::Hostname(s.to_string()));
    }
    Ok(s.to_string())
}

/// `256M`, `1G`, `1.5G`, `4096`: bytes, with K, M, G, T as powers of 1024
/// (docker's units; `Ki`, `MiB`, `MB` are read the same way).
pub fn parse_size(s: &str) -> Result<u64, ArgError> {
    let err = || ArgError::Size(s.to_string());
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit.trim_end_matches('b').trim_end_matches('i');
    let mult: u64 = match unit {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        _ => return Err(err()),
    };
    let n: f64 = num.parse().map_err(|_| err())?;
    let bytes = (n * mult as f64).round();
    if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
        return Err(err());
    }
    Ok(bytes as u64)
}

/// The smallest `--memory` that leaves room for the sandbox's own init.
const MIN_MEMORY: u64 = 4 << 20;

pub(crate) fn parse_memory(s: &str) -> Result<Limit<u64>, ArgError> {
    unlimited(s, |s| {
        let n = parse_size(s)?;
        if n < MIN_MEMORY {
            return Err(ArgError::MemoryTooSmall(s.to_string()));
        }
        Ok(n)
    })
}

pub(crate) fn parse_pids(s: &str) -> Result<Limit<u64>, ArgError> {
    unlimited(s, |s| match s.trim().parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(ArgError::Pids(s.to_string())),
    })
}

pub(crate) fn parse_tmp_size(s: &str) -> Result<u64, ArgError> {
    match parse_size(s)? {
        // tmpfs reads size=0 as "unlimited".
        0 => Err(ArgError::ZeroTmpSize(s.to_string())),
        n => Ok(n),
    }
}

pub(crate) fn parse_cpus(s: &str) -> Result<Limit<f64>, ArgError> {
    unlimited(s, |s| {
        let online = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        match s.trim().parse::<f64>() {
            Ok(c) if c.is_finite() && c >= 0.01 && c <= online as f64 => Ok(c),
            _ => Err(ArgError::Cpus { given: s.to_string(), online }),
        }
    })
}

/// `30s`, `500ms`, `1.5s`, `2m`, `1h`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, ArgError> {
    let err = || ArgError::Duration(s.to_string());
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| err())?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(err()),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| err())
}

pub(crate) fn parse_positive_duration(s: &str) -> Result<Duration, ArgError> {
    match parse_duration(s)? {
        d if d.is_zero() => Err(ArgError::ZeroDuration(s.to_string())),
        d => Ok(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("4096"), Ok(4096));
        for bad in ["", "M", "12X", "-1M", "1..2M", "1e3"] {
            let e = parse_size(bad).unwrap_err().to_string();
            assert!(e.contains("e.g. 256M"), "{bad}: {e}");
        }
        assert!(parse_memory("1M").unwrap_err().to_string().contains("at least 4M"));
        assert_eq!(parse_memory("unlimited"), Ok(Limit::Unlimited));
        assert_eq!(parse_memory("256M"), Ok(Limit::Value(256 << 20)));
        assert_eq!(parse_pids("UNLIMITED"), Ok(Limit::Unlimited));
        assert!(parse_pids("0").is_err());
        assert!(parse_tmp_size("0").is_err());
    }

    #[test]
    fn durations_and_cpus() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        for bad in ["", "s", "10 years", "-1s", "1d"] {
            assert!(parse_duration(bad).unwrap_err().to_string().contains("e.g. 30s"), "{bad}");
        }
        assert!(parse_positive_duration("0").is_err());
        assert_eq!(parse_cpus("0.5"), Ok(Limit::Value(0.5)));
        assert_eq!(parse_cpus("unlimited"), Ok(Limit::Unlimited));
        assert!(parse_cpus("0").unwrap_err().to_string().contains("between 0.01"));
        assert!(parse_cpus("100000").is_err());
        assert!(parse_cpus("nan").is_err());
    }

    #[test]
    fn hostnames_follow_rfc_1123() {
        for good in ["confine", "build-1", "a", "ci.example.com", "9lives", &"a".repeat(63)] {
            assert_eq!(parse_hostname(good).as_deref(), Ok(good), "{good}");
        }
        let long = format!("{}.{}", "a".repeat(40), "b".repeat(30));
        for bad in ["", "-x", "x-", "a_b", "a..b", ".a", "a.", "bad host", "h\u{e9}", &"a".repeat(64), &long] {
            let e = parse_hostname(bad).unwrap_err().to_string();
            assert!(e.contains("invalid hostname") && e.contains("e.g. build-1"), "{bad}: {e}");
        }
    }

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\nci:x:1001:1500::/home/ci:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nnogroup:x:65534:\nbuilders:x:1500:ci\n";

    #[test]
    fn user_names_and_numbers_as_docker_reads_them() {
        assert_eq!(user_ids("root", PASSWD, GROUP), Ok((0, 0)));
        assert_eq!(user_ids("0", PASSWD, GROUP), Ok((0, 0)));
        assert_eq!(user_ids("ci", PASSWD, GROUP), Ok((1001, 1500)));
        assert_eq!(user_ids("1001", PASSWD, GROUP), Ok((1001, 1500)));
        assert_eq!(user_ids("4242", PASSWD, GROUP), Ok((4242, 0)), "unknown numbers: group 0, as docker");
        assert_eq!(user_ids("ci:nogroup", PASSWD, GROUP), Ok((1001, 65534)));
        assert_eq!(user_ids("1000:1000", PASSWD, GROUP), Ok((1000, 1000)));
        let err = user_ids("alice", PASSWD, GROUP).unwrap_err().to_string();
        assert!(err.contains("no user 'alice'") && err.contains("/etc/passwd"), "{err}");
        let err = user_ids("ci:wheel", PASSWD, GROUP).unwrap_err().to_string();
        assert!(err.contains("no group 'wheel'"), "{err}");
        assert!(user_ids("", PASSWD, GROUP).is_err());
        assert!(user_ids("4294967295", PASSWD, GROUP).is_err());
    }
}
