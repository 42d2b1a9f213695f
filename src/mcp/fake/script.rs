//! The fake service's "runtime": a tiny interpreter for the handful of shell
//! and Python statements the tests use (`echo`, `sleep`, `exit`, `seq`,
//! `print(...)`, `time.sleep(...)`). It never starts a process.

use std::time::Duration;

/// One statement.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// A line on stdout.
    Out(String),
    /// A line on stderr.
    Err(String),
    /// The numbers from..=to, one per line, on stdout.
    Seq(u64, u64),
    /// Copy stdin to stdout.
    Cat,
    Sleep(Duration),
    /// Sets the status; `exit` also ends the script.
    Status(i32),
    Exit(i32),
}

/// A statement the interpreter does not know, by its command's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}: command not found")]
struct UnknownCommand(String);

/// Commands the fake policy refuses, with the reason it gives.
const DENIED: &[(&str, &str)] = &[
    ("rm", "destructive command"),
    ("sudo", "privilege escalation"),
    ("curl", "network access is off"),
    ("wget", "network access is off"),
    ("mount", "mounts are not allowed"),
];

/// A parsed script, or the policy's reasons to refuse it.
pub fn parse(runtime: &str, source: &str) -> Result<Vec<Step>, Vec<String>> {
    let mut steps = Vec::new();
    let mut denied = Vec::new();
    for stmt in source.split(['\n', ';']).flat_map(|s| s.split("&&")) {
        let stmt = stmt.trim();
        if stmt.is_empty() || stmt.starts_with('#') || stmt.starts_with("import ") {
            continue;
        }
        let step = if runtime == "python" { python(stmt) } else { shell(stmt) };
        match step {
            Ok(s) => steps.push(s),
            Err(unknown) => match DENIED.iter().find(|(name, _)| *name == unknown.0) {
                Some((name, why)) => denied.push(format!("denied by policy: '{name}': {why}")),
                None => {
                    steps.push(Step::Err(format!("fake: {unknown}")));
                    steps.push(Step::Status(127));
                }
            },
        }
    }
    if denied.is_empty() {
        Ok(steps)
    } else {
        Err(denied)
    }
}

/// A shell statement, or the command name it did not know.
fn shell(stmt: &str) -> Result<Step, UnknownCommand> {
    let (cmd, rest) = stmt.split_once(char::is_whitespace).unwrap_or((stmt, ""));
    let rest = rest.trim();
    match cmd {
        "echo" => match rest.strip_suffix(">&2").or_else(|| rest.strip_suffix("1>&2")) {
            Some(text) => Ok(Step::Err(unquote(text.trim()))),
            None => Ok(Step::Out(unquote(rest))),
        },
        "sleep" => Ok(Step::Sleep(seconds(rest))),
        "exit" => Ok(Step::Exit(rest.parse().unwrap_or(0))),
        "true" | ":" => Ok(Step::Status(0)),
        "false" => Ok(Step::Status(1)),
        "cat" if rest.is_empty() => Ok(Step::Cat),
        "seq" => {
            let nums: Vec<u64> = rest.split_whitespace().filter_map(|n| n.parse().ok()).collect();
            // Bounded: the fake keeps output in memory.
            let cap = |n: u64| n.min(1_000_000);
            match nums.as_slice() {
                [to] => Ok(Step::Seq(1, cap(*to))),
                [from, to, ..] => Ok(Step::Seq(*from, cap(*to))),
                [] => Ok(Step::Status(1)),
            }
        }
        other => Err(UnknownCommand(other.to_string())),
    }
}

/// A Python statement of the few forms the tests use.
fn python(stmt: &str) -> Result<Step, UnknownCommand> {
    let call = |name: &str| stmt.strip_prefix(name).and_then(|r| r.strip_suffix(')')).map(str::trim);
    if let Some(arg) = call("print(") {
        return Ok(Step::Out(unquote(arg)));
    }
    if let Some(arg) = call("time.sleep(") {
        return Ok(Step::Sleep(seconds(arg)));
    }
    if let Some(arg) = call("sys.exit(").or_else(|| call("exit(")) {
        return Ok(Step::Exit(arg.parse().unwrap_or(0)));
    }
    if stmt.starts_with("raise") {
        return Ok(Step::Err(format!("Traceback (most recent call last):\n  {stmt}\nError: raised")));
    }
    Err(UnknownCommand(stmt.split(|c: char| !c.is_alphanumeric() && c != '_').next().unwrap_or(stmt).to_string()))
}

fn unquote(s: &str) -> String {
    let s = s.trim();
    for q in ['"', '\''] {
        if let Some(inner) = s.strip_prefix(q).and_then(|r| r.strip_suffix(q)) {
            return inner.to_string();
        }
    }
    s.to_string()
}

fn seconds(s: &str) -> Duration {
    let secs: f64 = s.trim().trim_end_matches('s').parse().unwrap_or(0.0);
    Duration::from_secs_f64(secs.clamp(0.0, 3600.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_statements() {
        let s = parse("shell", "echo hi; echo 'oops' >&2\nsleep 0.5 && exit 3").unwrap();
        assert_eq!(
            s,
            vec![
                Step::Out("hi".into()),
                Step::Err("oops".into()),
                Step::Sleep(Duration::from_millis(500)),
                Step::Exit(3)
            ]
        );
    }

    #[test]
    fn python_statements() {
        let s = parse("python", "import time\nprint(\"hi\")\ntime.sleep(1)").unwrap();
        assert_eq!(s, vec![Step::Out("hi".into()), Step::Sleep(Duration::from_secs(1))]);
    }

    #[test]
    fn policy_and_unknown_commands() {
        let e = parse("shell", "echo a; rm -rf /").unwrap_err();
        assert_eq!(e, vec!["denied by policy: 'rm': destructive command".to_string()]);
        let s = parse("shell", "frobnicate").unwrap();
        assert_eq!(s[1], Step::Status(127));
    }
}
