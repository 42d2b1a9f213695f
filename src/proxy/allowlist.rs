//! The network allowlist: which hosts and ports a job's proxy may reach.
//!
//! An entry is `HOST[:PORT][+FLAG…]`:
//! - `HOST` is a name (`registry.example.org`), a wildcard over a name's
//!   subdomains (`*.example.org`, not the name itself), an IPv4 literal,
//!   or an IPv6 literal in brackets (`[2001:db8::1]`, or bare without a port);
//! - without `:PORT` the entry opens ports 443 and 80; with one, only that port;
//! - flags: `+nosni` lets a TLS tunnel without a server name through,
//!   `+ech` one with an encrypted ClientHello, `+raw` a tunnel that is not
//!   TLS at all (SSH, a database), `+force` a wildcard over a public
//!   suffix (`*.com`) or everything (`*`).
//!
//! Names are compared in lowercase ASCII without a trailing dot; a name
//! outside ASCII must be given in its punycode form (`xn--…`).
//!
//! An IP literal also names an address: a name on the list that resolves
//! to a loopback, private or link-local address is refused unless the
//! list has that address too (`proxy::addr`).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::IpAddr;

/// Ports an entry without one opens.
pub const DEFAULT_PORTS: [u16; 2] = [443, 80];

/// The host part of an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// Exactly this name.
    Name(String),
    /// Any name ending in `.suffix`.
    Suffix(String),
    /// Every name (`*+force`).
    Any,
    /// This address, given literally.
    Ip(IpAddr),
}

/// One parsed entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub host: HostPattern,
    /// `None`: [`DEFAULT_PORTS`].
    pub port: Option<u16>,
    pub allow_no_sni: bool,
    pub allow_ech: bool,
    pub allow_raw: bool,
    forced: bool,
}

/// Why an entry can't be used. Each names the entry as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("network allowlist entry '{0}' is empty")]
    Empty(String),
    #[error("network allowlist entry '{entry}': bad port '{port}' (give 1-65535, e.g. host:8443)")]
    Port { entry: String, port: String },
    #[error("network allowlist entry '{entry}': unknown flag '+{flag}' (flags: +nosni, +ech, +raw, +force)")]
    Flag { entry: String, flag: String },
    #[error("network allowlist entry '{entry}': '{host}' is not a host name ({why})")]
    Name { entry: String, host: String, why: &'static str },
    #[error(
        "network allowlist entry '{entry}' opens every name under the public suffix '{suffix}': \
         name the hosts instead, or add +force to mean it"
    )]
    PublicSuffix { entry: String, suffix: String },
    #[error("network allowlist entry '*' opens every host: name the hosts instead, or write '*+force' to mean it")]
    Everything,
    #[error("network allowlist '@{0}' is not defined: add it under [network.allow] in confine.toml")]
    UnknownList(String),
    #[error("the network allowlist is empty: name at least one host (e.g. allow:registry.example.org)")]
    NoEntries,
    #[error("the network allowlist has {count} entries, above the limit of {max}")]
    TooMany { count: usize, max: usize },
}

/// Why a connection's target is refused: not a host, or not allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// `host` is shown clipped: the client chose it.
    #[error("'{host}' is not a host name ({why})")]
    NotAHost { host: String, why: &'static str },
    #[error("port {port} is not open for {host} (an entry opens 443 and 80, or the port it names)")]
    Port { host: String, port: u16 },
    #[error("{0} is an address, and the allowlist does not name it")]
    Address(String),
    #[error("{0} is not on the allowlist")]
    Name(String),
}

/// Most entries one job's allowlist may have, after `@name`s are expanded.
pub const MAX_ENTRIES: usize = 256;

impl Entry {
    /// Parse one entry (see the module's doc for the grammar).
    pub fn parse(raw: &str) -> Result<Entry, EntryError> {
        let text = raw.trim();
        if text.is_empty() {
            return Err(EntryError::Empty(raw.into()));
        }
        let mut parts = text.split('+');
        let hostport = parts.next().unwrap_or_default();
        let (mut allow_no_sni, mut allow_ech, mut allow_raw, mut forced) = (false, false, false, false);
        for flag in parts {
            match flag.to_ascii_lowercase().as_str() {
                "nosni" => allow_no_sni = true,
                "ech" => allow_ech = true,
                "raw" => allow_raw = true,
                "force" => forced = true,
                _ => return Err(EntryError::Flag { entry: raw.into(), flag: flag.into() }),
            }
        }
        let (host, port) = split_host_port(raw, hostport)?;
        let host = parse_host(raw, host)?;
        match &host {
            HostPattern::Any if !forced => return Err(EntryError::Everything),
            HostPattern::Suffix(s) if !forced && is_public_suffix(s) => {
                return Err(EntryError::PublicSuffix { entry: raw.into(), suffix: s.clone() })
            }
            _ => {}
        }
        Ok(Entry { host, port, allow_no_sni, allow_ech, allow_raw, forced })
    }

    /// Whether this entry opens `port`.
    pub fn opens_port(&self, port: u16) -> bool {
        match self.port {
            Some(p) => p == port,
            None => DEFAULT_PORTS.contains(&port),
        }
    }

    /// Whether this entry covers the name (normalized: lowercase, no trailing dot).
    fn covers_name(&self, name: &str) -> bool {
        match &self.host {
            HostPattern::Name(n) => n == name,
            HostPattern::Suffix(s) => {
                name.len() > s.len() + 1 && name.ends_with(s.as_str()) && {
                    let cut = name.len() - s.len() - 1;
                    name.as_bytes()[cut] == b'.'
                }
            }
            HostPattern::Any => true,
            HostPattern::Ip(_) => false,
        }
    }
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostPattern::Name(n) => f.write_str(n)?,
            HostPattern::Suffix(s) => write!(f, "*.{s}")?,
            HostPattern::Any => f.write_str("*")?,
            HostPattern::Ip(IpAddr::V4(a)) => write!(f, "{a}")?,
            HostPattern::Ip(IpAddr::V6(a)) if self.port.is_some() => write!(f, "[{a}]")?,
            HostPattern::Ip(IpAddr::V6(a)) => write!(f, "{a}")?,
        }
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        let flags =
            [(self.allow_no_sni, "nosni"), (self.allow_ech, "ech"), (self.allow_raw, "raw"), (self.forced, "force")];
        for (on, name) in flags {
            if on {
                write!(f, "+{name}")?;
            }
        }
        Ok(())
    }
}

fn split_host_port<'a>(raw: &str, text: &'a str) -> Result<(&'a str, Option<u16>), EntryError> {
    let bad_port = |p: &str| EntryError::Port { entry: raw.into(), port: p.into() };
    let parse_port = |p: &str| match p.parse::<u16>() {
        Ok(0) | Err(_) => Err(bad_port(p)),
        Ok(n) => Ok(n),
    };
    if let Some(rest) = text.strip_prefix('[') {
        let Some((host, after)) = rest.split_once(']') else {
            return Err(EntryError::Name { entry: raw.into(), host: text.into(), why: "no closing ']'" });
        };
        return match after {
            "" => Ok((host, None)),
            _ => match after.strip_prefix(':') {
                Some(p) => Ok((host, Some(parse_port(p)?))),
                None => Err(bad_port(after)),
            },
        };
    }
    // A bare IPv6 literal has colons of its own and no port.
    if text.matches(':').count() > 1 {
        return Ok((text, None));
    }
    match text.split_once(':') {
        Some((host, port)) => Ok((host, Some(parse_port(port)?))),
        None => Ok((text, None)),
    }
}

fn parse_host(raw: &str, host: &str) -> Result<HostPattern, EntryError> {
    if host == "*" {
        return Ok(HostPattern::Any);
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(HostPattern::Ip(canonical_ip(ip)));
    }
    if let Some(suffix) = host.strip_prefix("*.") {
        let name =
            normalize_name(suffix).map_err(|why| EntryError::Name { entry: raw.into(), host: host.into(), why })?;
        return Ok(HostPattern::Suffix(name));
    }
    let name = normalize_name(host).map_err(|why| EntryError::Name { entry: raw.into(), host: host.into(), why })?;
    Ok(HostPattern::Name(name))
}

/// An IPv4 address written as IPv6 (`::ffff:127.0.0.1`) is that IPv4 address.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Lowercase, without a trailing dot, and checked: labels of letters,
/// digits, `-` and `_`, 1 to 63 bytes each, 253 in all.
pub fn normalize_name(host: &str) -> Result<String, &'static str> {
    let name = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    if name.is_empty() {
        return Err("empty");
    }
    if name.len() > 253 {
        return Err("longer than 253 bytes");
    }
    if !name.is_ascii() {
        return Err("not ASCII: give its punycode form, xn--…");
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("an empty label");
        }
        if label.len() > 63 {
            return Err("a label longer than 63 bytes");
        }
        if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return Err("only letters, digits, '-' and '_' may appear in a label");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label starts or ends with '-'");
        }
    }
    // All digits and dots would be read as an address by some clients.
    if name.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err("looks like a partial IPv4 address");
    }
    Ok(name)
}

/// Whether `name` is itself a public suffix (`com`, `co.uk`, `github.io`),
/// or a name with one label (a TLD the list does not know).
fn is_public_suffix(name: &str) -> bool {
    !name.contains('.') || psl::suffix_str(name) == Some(name)
}

/// A job's allowlist, parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    pub entries: Vec<Entry>,
}

/// What the allowlist says about one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The entry that allowed it, as written back (`Entry`'s Display).
    pub entry: String,
    pub allow_no_sni: bool,
    pub allow_ech: bool,
    pub allow_raw: bool,
}

impl Allowlist {
    /// Parse entries already expanded (no `@name`).
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Allowlist, EntryError> {
        if entries.is_empty() {
            return Err(EntryError::NoEntries);
        }
        if entries.len() > MAX_ENTRIES {
            return Err(EntryError::TooMany { count: entries.len(), max: MAX_ENTRIES });
        }
        let entries = entries.iter().map(|e| Entry::parse(e.as_ref())).collect::<Result<Vec<_>, _>>()?;
        Ok(Allowlist { entries })
    }

    /// The entry allowing `host` (a name or an IP literal, as the client
    /// gave it) on `port`, or why none does.
    pub fn grant(&self, host: &str, port: u16) -> Result<Grant, Refused> {
        let target = Target::parse(host)?;
        let mut name_matched = false;
        for e in &self.entries {
            let covers = match (&target, &e.host) {
                (Target::Ip(ip), HostPattern::Ip(listed)) => ip == listed,
                (Target::Ip(_), _) => false,
                (Target::Name(n), _) => e.covers_name(n),
            };
            if !covers {
                continue;
            }
            name_matched = true;
            if e.opens_port(port) {
                return Ok(Grant {
                    entry: e.to_string(),
                    allow_no_sni: e.allow_no_sni,
                    allow_ech: e.allow_ech,
                    allow_raw: e.allow_raw,
                });
            }
        }
        Err(match (name_matched, &target) {
            (true, _) => Refused::Port { host: host.to_string(), port },
            (false, Target::Ip(_)) => Refused::Address(host.to_string()),
            (false, Target::Name(_)) => Refused::Name(host.to_string()),
        })
    }

    /// Whether an address the list names literally, on `port`, allows
    /// connecting to `ip` even where it is not public.
    pub fn names_address(&self, ip: IpAddr, port: u16) -> bool {
        let ip = canonical_ip(ip);
        self.entries.iter().any(|e| e.host == HostPattern::Ip(ip) && e.opens_port(port))
    }

    /// The entries as written back, normalized.
    pub fn to_strings(&self) -> Vec<String> {
        self.entries.iter().map(Entry::to_string).collect()
    }
}

/// A connection's target as the client named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Name(String),
    Ip(IpAddr),
}

impl Target {
    /// `host` as in a CONNECT authority or a URL: a name, an IPv4
    /// literal, or an IPv6 literal with or without brackets.
    pub fn parse(host: &str) -> Result<Target, Refused> {
        let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(Target::Ip(canonical_ip(ip)));
        }
        // IPv6 zone ids, and other shapes no name has.
        normalize_name(bare)
            .map(Target::Name)
            .map_err(|why| Refused::NotAHost { host: crate::proxy::clip_text(host, 80), why })
    }
}

/// A request's network, before its `@name`s are expanded: what the CLI
/// and MCP accept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct AllowRequest {
    pub allow: Vec<String>,
}

/// Expand `@name` references through the named lists of confine.toml's
/// `[network.allow]`, then parse every entry.
pub fn expand(
    entries: &[String],
    named: &std::collections::BTreeMap<String, Vec<String>>,
) -> Result<Allowlist, EntryError> {
    let mut out = Vec::new();
    for e in entries {
        match e.trim().strip_prefix('@') {
            Some(name) => match named.get(name) {
                Some(list) => out.extend(list.iter().cloned()),
                None => return Err(EntryError::UnknownList(name.into())),
            },
            None => out.push(e.clone()),
        }
    }
    Allowlist::parse(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> Allowlist {
        Allowlist::parse(entries).unwrap()
    }

    #[test]
    fn names_wildcards_and_ports_match_as_documented() {
        let l = list(&["registry.example.org", "*.files.example.org", "api.example.org:8443"]);
        assert!(l.grant("registry.example.org", 443).is_ok());
        assert!(l.grant("REGISTRY.example.org.", 80).is_ok());
        assert!(l.grant("registry.example.org", 22).unwrap_err().to_string().contains("port 22 is not open"));
        assert!(l.grant("a.files.example.org", 443).is_ok());
        assert!(l.grant("a.b.files.example.org", 443).is_ok());
        assert!(l.grant("files.example.org", 443).is_err(), "a wildcard does not cover its apex");
        assert!(l.grant("evilfiles.example.org", 443).is_err());
        assert!(l.grant("api.example.org", 8443).is_ok());
        assert!(l.grant("api.example.org", 443).is_err(), "a port given opens only that port");
        assert!(l.grant("example.org", 443).unwrap_err().to_string().contains("not on the allowlist"));
    }

    #[test]
    fn ip_literals_match_only_themselves() {
        let l = list(&["127.0.0.1:8080", "[::1]:8443", "2001:db8::1", "example.org"]);
        assert!(l.grant("127.0.0.1", 8080).is_ok());
        assert!(l.grant("::ffff:127.0.0.1", 8080).is_ok(), "a mapped IPv4 address is that address");
        assert!(l.grant("[::1]", 8443).is_ok());
        assert!(l.grant("::1", 8443).is_ok());
        assert!(l.grant("2001:db8::1", 443).is_ok());
        assert!(l.grant("[2001:0db8::0001]", 80).is_ok());
        assert!(l.grant("127.0.0.2", 8080).unwrap_err().to_string().contains("does not name it"));
        assert!(l.grant("93.184.216.34", 443).is_err(), "a name on the list is not its addresses");
        assert!(l.names_address("127.0.0.1".parse().unwrap(), 8080));
        assert!(!l.names_address("127.0.0.1".parse().unwrap(), 80));
    }

    #[test]
    fn malformed_entries_are_refused_naming_the_entry() {
        for (bad, says) in [
            ("", "empty"),
            ("host:0", "bad port '0'"),
            ("host:99999", "bad port"),
            ("host:http", "bad port"),
            ("exa mple.org", "only letters"),
            ("exa/mple.org", "only letters"),
            ("-x.org", "starts or ends"),
            ("a..org", "empty label"),
            ("bücher.de", "punycode"),
            ("host+wide", "unknown flag '+wide'"),
            ("[::1", "no closing"),
            ("1.2.3", "partial IPv4"),
        ] {
            let e = Entry::parse(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
            if !bad.is_empty() {
                assert!(e.contains(&format!("'{bad}'")) || e.contains(bad), "{bad}: {e}");
            }
        }
    }

    #[test]
    fn public_suffix_wildcards_need_force() {
        for wide in ["*.com", "*.co.uk", "*.github.io", "*.internal"] {
            let e = Entry::parse(wide).unwrap_err().to_string();
            assert!(e.contains("public suffix") && e.contains("+force"), "{wide}: {e}");
            assert!(Entry::parse(&format!("{wide}+force")).is_ok());
        }
        assert_eq!(Entry::parse("*").unwrap_err(), EntryError::Everything);
        assert!(list(&["*+force"]).grant("anything.example", 443).is_ok());
        assert!(list(&["*+force"]).grant("10.0.0.1", 443).is_err(), "'*' covers names, not addresses");
        assert!(Entry::parse("*.example.co.uk").is_ok());
        assert!(Entry::parse("*.corp.internal").is_ok());
    }

    #[test]
    fn named_lists_expand_and_unknown_ones_are_errors() {
        let mut named = std::collections::BTreeMap::new();
        named.insert("python".to_string(), vec!["pypi.org".to_string(), "files.pythonhosted.org".to_string()]);
        let l = expand(&["@python".into(), "example.org".into()], &named).unwrap();
        assert_eq!(l.to_strings(), ["pypi.org", "files.pythonhosted.org", "example.org"]);
        assert_eq!(expand(&["@npm".into()], &named).unwrap_err(), EntryError::UnknownList("npm".into()));
        assert_eq!(expand(&[], &named).unwrap_err(), EntryError::NoEntries);
    }

    #[test]
    fn entries_print_back_normalized() {
        assert_eq!(Entry::parse("Example.ORG.:8443+NOSNI").unwrap().to_string(), "example.org:8443+nosni");
        assert_eq!(Entry::parse("[::1]:80").unwrap().to_string(), "[::1]:80");
        assert_eq!(Entry::parse("::1").unwrap().to_string(), "::1");
    }
}
