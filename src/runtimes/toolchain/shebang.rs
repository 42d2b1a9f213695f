//! The `#!` line of a toolchain script (a pyenv shim, npm's `tsx`), read
//! to find the interpreter the script needs in the sandbox, and `env`'s
//! options, parsed as `env` parses them.
//!
//! Only files in trusted locations are read ([`super::trust`]); a
//! repository's file never is. Whatever a line says, the interpreter it
//! names is only looked up through the same trust rules, so a line this
//! parser misreads can fail to bind something, never bind an untrusted
//! directory. Reads never block (a FIFO is refused) and stop at 256 bytes,
//! as the kernel's do.

use std::path::Path;

/// Bytes of a `#!` line the kernel reads (BINPRM_BUF_SIZE).
const HEAD_BYTES: usize = 256;

/// What a `#!` line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Interpreter {
    /// An interpreter named by path (`#!/usr/bin/python3`).
    Path(String),
    /// A command `env` looks up (`#!/usr/bin/env -S node --flag`), with
    /// the search path of `env -P`, if any.
    Env { env: String, command: String, alt_path: Option<String> },
}

/// The interpreter `file`'s `#!` line names, if it has one.
pub(crate) fn interpreter(file: &Path) -> Option<Interpreter> {
    parse_line(&read_head(file)?)
}

/// The first [`HEAD_BYTES`] of a regular file, opened without blocking
/// and without following a last symlink.
fn read_head(file: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(
        &mut opts,
        libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
    );
    let f = opts.open(file).ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut head = Vec::with_capacity(HEAD_BYTES);
    f.take(HEAD_BYTES as u64).read_to_end(&mut head).ok()?;
    Some(head)
}

/// Parse a `#!` line as Linux does: the interpreter up to the first blank,
/// then the rest of the line, trimmed, as one argument.
pub(crate) fn parse_line(head: &[u8]) -> Option<Interpreter> {
    let line = head.strip_prefix(b"#!")?;
    let line = line.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let line = line.trim_matches([' ', '\t', '\r']);
    let (interp, arg) = match line.find([' ', '\t']) {
        Some(i) => (&line[..i], line[i..].trim_matches([' ', '\t', '\r'])),
        None => (line, ""),
    };
    if interp.is_empty() {
        return None;
    }
    if super::super::basename(interp) != "env" {
        return Some(Interpreter::Path(interp.to_string()));
    }
    let args: Vec<String> = if arg.is_empty() { Vec::new() } else { vec![arg.to_string()] };
    let (command, alt_path) = env_command(args)?;
    Some(Interpreter::Env { env: interp.to_string(), command, alt_path })
}

/// The command `env ARGS…` would run, and its `-P` search path: GNU and
/// BSD `env` options (`-i`, `-0`, `-v`, `-u NAME`, `-C DIR`, `-P PATH`,
/// `-S STRING`, their long forms, `--`), then `NAME=VALUE` assignments,
/// then the command. `None` when there is none, or an option is unknown.
pub(crate) fn env_command(args: Vec<String>) -> Option<(String, Option<String>)> {
    let mut args: std::collections::VecDeque<String> = args.into();
    let mut alt_path = None;
    let mut options = true;
    while let Some(a) = args.pop_front() {
        if options && a == "--" {
            options = false;
            continue;
        }
        if options && a == "-" {
            continue; // -i
        }
        if options && a.starts_with("--") {
            let (name, value) = match a[2..].split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => (a[2..].to_string(), None),
            };
            match name.as_str() {
                "ignore-environment"
                | "null"
                | "debug"
                | "list-signal-handling"
                | "block-signal"
                | "default-signal"
                | "ignore-signal" => {}
                "unset" | "chdir" => {
                    if value.is_none() {
                        args.pop_front()?;
                    }
                }
                "split-string" => {
                    let s = match value {
                        Some(v) => v,
                        None => args.pop_front()?,
                    };
                    prepend(&mut args, split_string(&s)?);
                }
                _ => return None,
            }
            continue;
        }
        if options && a.starts_with('-') {
            let cluster: Vec<char> = a.chars().skip(1).collect();
            let mut i = 0;
            while i < cluster.len() {
                let c = cluster[i];
                let rest: String = cluster[i + 1..].iter().collect();
                match c {
                    'i' | '0' | 'v' => {
                        i += 1;
                        continue;
                    }
                    'u' | 'C' | 'P' | 'S' => {
                        let value = if rest.is_empty() { args.pop_front()? } else { rest };
                        match c {
                            'P' => alt_path = Some(value),
                            'S' => prepend(&mut args, split_string(&value)?),
                            _ => {}
                        }
                    }
                    _ => return None,
                }
                break;
            }
            continue;
        }
        if a.contains('=') {
            continue; // NAME=VALUE
        }
        return Some((a, alt_path));
    }
    None
}

fn prepend(args: &mut std::collections::VecDeque<String>, words: Vec<String>) {
    for w in words.into_iter().rev() {
        args.push_front(w);
    }
}

/// `env -S`'s splitting: blanks separate words; single quotes keep text
/// as is, double quotes and backslashes escape. `None` for an unclosed
/// quote (env refuses it too).
fn split_string(s: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\n' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '\'' => break,
                        ch => word.push(ch),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' => word.push(chars.next()?),
                        ch => word.push(ch),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.push(chars.next()?);
            }
            // `#` at the start of a word ends the string (a comment).
            '#' if !in_word => break,
            ch => {
                in_word = true;
                word.push(ch);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Some(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(line: &str) -> Option<(String, Option<String>)> {
        match parse_line(line.as_bytes())? {
            Interpreter::Env { command, alt_path, .. } => Some((command, alt_path)),
            Interpreter::Path(p) => panic!("{line}: not env but {p}"),
        }
    }

    fn cmd(line: &str) -> Option<String> {
        env(line).map(|(c, _)| c)
    }

    #[test]
    fn a_path_interpreter_is_taken_as_written() {
        assert_eq!(parse_line(b"#!/usr/bin/python3 -u\nprint()"), Some(Interpreter::Path("/usr/bin/python3".into())));
        assert_eq!(parse_line(b"#! /bin/sh\n"), Some(Interpreter::Path("/bin/sh".into())));
        assert_eq!(parse_line(b"#!\n"), None);
        assert_eq!(parse_line(b"\x7fELF"), None);
    }

    #[test]
    fn env_gets_the_rest_of_the_line_as_one_argument() {
        assert_eq!(cmd("#!/usr/bin/env node\n"), Some("node".into()));
        // Without -S, "python3 -u" is one word: a command nobody has.
        assert_eq!(cmd("#!/usr/bin/env python3 -u\n"), Some("python3 -u".into()));
        assert_eq!(cmd("#!/usr/bin/env\n"), None);
    }

    /// An attack seen in review: `-u` takes the next word as a variable's
    /// name. The old parser took `/ANY/PATH` for the interpreter.
    #[test]
    fn env_options_take_their_values() {
        assert_eq!(cmd("#!/usr/bin/env -S -u /ANY/PATH sh -c 'ls /'\n"), Some("sh".into()));
        assert_eq!(cmd("#!/usr/bin/env -S -u/ANY/PATH sh\n"), Some("sh".into()));
        assert_eq!(cmd("#!/usr/bin/env -S --unset=/ANY/PATH --chdir /x python3\n"), Some("python3".into()));
        assert_eq!(cmd("#!/usr/bin/env -S -C /ANY/DIR -i A=/B/C -- node --x\n"), Some("node".into()));
        assert_eq!(cmd("#!/usr/bin/env -S -iv -u X -- A=1 ruby\n"), Some("ruby".into()));
        assert_eq!(cmd("#!/usr/bin/env -S 'deno' run\n"), Some("deno".into()));
        assert_eq!(cmd("#!/usr/bin/env -Snode --harmony\n"), Some("node".into()));
        assert_eq!(
            env("#!/usr/bin/env -S -P /opt/py/bin:/usr/bin python3\n"),
            Some(("python3".into(), Some("/opt/py/bin:/usr/bin".into())))
        );
        assert_eq!(cmd("#!/usr/bin/env -S -- -u x\n"), Some("-u".into()));
        // Unknown options and unclosed quotes: nothing.
        assert_eq!(cmd("#!/usr/bin/env -S -Z sh\n"), None);
        assert_eq!(cmd("#!/usr/bin/env -S 'sh\n"), None);
        assert_eq!(cmd("#!/usr/bin/env -S -u\n"), None);
        assert_eq!(cmd("#!/usr/bin/env -S # only a comment\n"), None);
    }

    #[test]
    fn a_fifo_is_never_opened_for_reading_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: c is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        // No writer: a blocking open would hang here.
        assert_eq!(interpreter(&fifo), None);
        let link = dir.path().join("link");
        std::fs::write(dir.path().join("real"), "#!/bin/sh\n").unwrap();
        std::os::unix::fs::symlink(dir.path().join("real"), &link).unwrap();
        assert_eq!(interpreter(&link), None, "a last symlink is not followed");
        assert_eq!(interpreter(&dir.path().join("real")), Some(Interpreter::Path("/bin/sh".into())));
    }
}
