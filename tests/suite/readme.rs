//! Every README block marked ```` ```sh runnable ```` runs as written: in a
//! temporary directory holding the files the examples name (`project/`
//! with a Makefile, `untrusted.sh`, `build.sh`, `main.rs`), as root, with
//! this build's `confine` first on PATH. Each command must exit 0, or the
//! status its comment names (`# exit N`).

use crate::common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// The runnable blocks of the README, each as its lines.
fn runnable_blocks(readme: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in readme.lines() {
        match current.as_mut() {
            None if line.trim_end() == "```sh runnable" => current = Some(Vec::new()),
            None => {}
            Some(_) if line.starts_with("```") => blocks.extend(current.take()),
            Some(lines) => lines.push(line.to_string()),
        }
    }
    assert!(current.is_none(), "a runnable block is not closed");
    blocks
}

/// The status a line's comment names, `# exit N …`, and the command
/// without the comment.
fn expected_status(line: &str) -> Option<(&str, i32)> {
    let (cmd, comment) = line.rsplit_once(" # ")?;
    let n = comment.trim().strip_prefix("exit ")?;
    let n: i32 = n.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()?;
    Some((cmd.trim_end(), n))
}

/// The block as a bash script under `-e -o pipefail`: a line that names
/// its status is checked for exactly that status. Lines inside a heredoc
/// are left as they are.
fn script(block: &[String]) -> String {
    let mut out = String::from("set -e -o pipefail\n");
    let mut heredoc: Option<String> = None;
    for line in block {
        if let Some(end) = &heredoc {
            if line.trim() == end {
                heredoc = None;
            }
            out.push_str(line);
            out.push('\n');
            continue;
        }
        if let Some(i) = line.find("<<") {
            let word: String = line[i + 2..]
                .trim_start_matches('-')
                .trim_start_matches('\'')
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            heredoc = Some(word);
        }
        let shown = line.replace('\'', r"'\''");
        out.push_str(&format!("echo '+ {shown}' >&2\n"));
        match expected_status(line) {
            Some((cmd, n)) => out.push_str(&format!(
                "if {cmd}; then echo 'README: exit 0, expected {n}' >&2; exit 99; \
                 else s=$?; [ $s -eq {n} ] || {{ echo \"README: exit $s, expected {n}\" >&2; exit 99; }}; fi\n"
            )),
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    assert!(heredoc.is_none(), "a heredoc is not closed: {block:?}");
    out
}

/// The files the examples name.
fn fixtures(dir: &Path) {
    // project/ is the `--rw` workspace: its tests write. `exec --repo .`
    // mounts the repository read-only (unless workspace_rw = true), so
    // the tests at the top only read.
    std::fs::create_dir(dir.join("project")).unwrap();
    std::fs::write(dir.join("project/Makefile"), "test:\n\t@echo tests pass > result.txt\n\t@echo tests pass\n")
        .unwrap();
    std::fs::write(dir.join("Makefile"), "test:\n\t@cat Makefile > /dev/null\n\t@echo tests pass\n").unwrap();
    for (name, text) in [("untrusted.sh", "#!/bin/sh\necho untrusted ran\n"), ("build.sh", "#!/bin/sh\necho built\n")] {
        std::fs::write(dir.join(name), text).unwrap();
        std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::write(dir.join("main.rs"), "fn main() {\n    println!(\"hello from rust\");\n}\n").unwrap();
}

#[test]
fn the_parser_reads_exit_comments_and_heredocs() {
    assert_eq!(expected_status("confine run -- ./x   # exit 127: why"), Some(("confine run -- ./x", 127)));
    assert_eq!(expected_status("enabled = true   # off by default"), None);
    let s =
        script(&["cat > f <<'T'".into(), "a = 1   # exit 3 is data here".into(), "T".into(), "false # exit 1".into()]);
    assert!(s.contains("\na = 1   # exit 3 is data here\n"), "{s}");
    assert!(s.contains("if false; then"), "{s}");
}

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap()
}

/// A block run as [`script`] makes it, in a fresh directory (root-owned
/// and 0700, as `mktemp -d` makes it) with the [`fixtures`], this build's
/// `confine` first on PATH and no configuration of the host's.
fn run_block(block: &[String]) -> (std::process::Output, tempfile::TempDir) {
    let bin_dir = Path::new(bin()).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let dir = tempfile::tempdir().unwrap();
    fixtures(dir.path());
    let out = Command::new("bash")
        .arg("-c")
        .arg(script(block))
        .current_dir(dir.path())
        .env("PATH", &path)
        .env("XDG_DATA_HOME", dir.path().join(".data"))
        .env("XDG_CONFIG_HOME", dir.path().join(".config"))
        .env_remove("CONFINE_CONFIG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (out, dir)
}

/// The docs' `--env-file` example, taken from the README as written and
/// run: the format docker reads, a bare `KEY` refused without consent and
/// given the caller's value with it; and `confine run --help` says the
/// same rule.
#[test]
fn the_env_file_example_of_the_docs_runs_as_they_say() {
    if !sandbox_available() {
        return;
    }
    let blocks = runnable_blocks(&readme());
    let block = blocks
        .iter()
        .find(|b| b.iter().any(|l| l.contains("--env-file")))
        .expect("the README has a runnable --env-file example");
    let (out, _dir) = run_block(block);
    assert!(out.status.success(), "{}\n--- stderr\n{}", block.join("\n"), stderr(&out));
    // The refused line printed nothing; the consented one the file's value
    // and the caller's.
    assert_eq!(stdout(&out), "test true\n", "{}", stderr(&out));
    assert!(stderr(&out).contains("'CI' would take confine's own value"), "{}", stderr(&out));
    let help = Command::new(bin()).args(["run", "--help"]).output().unwrap();
    let help = stdout(&help).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        help.contains("or a bare KEY to pass this environment's value (a file may name bare only a KEY of sandbox.env_allowlist in confine.toml or one given with -e"),
        "{help}"
    );
}

#[test]
fn every_runnable_readme_example_runs_as_written() {
    if !is_root() {
        return skip("the README's examples are run as root, as a CI runner runs them");
    }
    if !sandbox_available() {
        return;
    }
    let blocks = runnable_blocks(&readme());
    assert!(blocks.len() >= 3, "the README's runnable blocks were not found: {}", blocks.len());
    for (i, block) in blocks.iter().enumerate() {
        let (out, dir) = run_block(block);
        assert!(
            out.status.success(),
            "README block {} failed ({}):\n{}\n--- stdout\n{}--- stderr\n{}",
            i + 1,
            out.status,
            block.join("\n"),
            stdout(&out),
            stderr(&out)
        );
        if block.iter().any(|l| l.contains("make test") && l.contains("--rw")) {
            let made = dir.path().join("project/result.txt");
            assert_eq!(std::fs::read_to_string(&made).unwrap(), "tests pass\n");
            use std::os::unix::fs::MetadataExt;
            assert_eq!(std::fs::metadata(&made).unwrap().uid(), 0, "the job's file lands as the workspace's owner");
        }
    }
}

/// contrib/systemd/confine.service is a unit systemd accepts: `systemd-analyze
/// verify` (where systemd is installed) with its ExecStart pointed at this
/// build and its Documentation= at the pages `confine man` writes.
#[test]
fn the_systemd_unit_verifies() {
    let unit =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/contrib/systemd/confine.service")).unwrap();
    assert!(unit.contains("Delegate=yes") && unit.contains("ExecStart=/usr/local/bin/confine serve"), "{unit}");
    if std::process::Command::new("systemd-analyze").arg("--version").output().is_err() {
        eprintln!("systemd-analyze is not installed: the unit was not verified");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let man = dir.path().join("man/man1");
    let pages =
        std::process::Command::new(env!("CARGO_BIN_EXE_confine")).arg("man").arg("--dir").arg(&man).output().unwrap();
    assert!(pages.status.success(), "{}", String::from_utf8_lossy(&pages.stderr));
    let path = dir.path().join("confine.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/confine", env!("CARGO_BIN_EXE_confine"))).unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .env("MANPATH", dir.path().join("man"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "systemd-analyze verify: {said}");
    // Older systemd (before 254) ignores DelegateSubgroup=, as the unit's
    // comment says; nothing else may be unknown or wrong.
    for line in said.lines().filter(|l| !l.trim().is_empty()) {
        assert!(line.contains("Unknown key 'DelegateSubgroup'"), "systemd-analyze verify: {line}");
    }
}
