//! Shell completions and man pages, generated from the CLI's own
//! definition (clap), so that they never drift from `--help`.

use super::{Cli, EXIT_CONFINE_FAILED};
use clap::CommandFactory;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
#[command(after_help = "Install them where your shell looks, for example:\n  \
confine completions bash > /etc/bash_completion.d/confine\n  \
confine completions zsh > \"${fpath[1]}/_confine\"\n  \
confine completions fish > ~/.config/fish/completions/confine.fish")]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  confine man | man -l -\n  confine man --dir /usr/local/share/man/man1")]
pub struct ManArgs {
    /// Write confine.1 and one page per subcommand (confine-run.1, …) into
    /// DIR, instead of confine.1 to standard output.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// `confine completions SHELL`: the script on standard output.
pub fn completions(args: CompletionsArgs) -> i32 {
    let mut cmd = Cli::command();
    // Into memory first: clap_complete panics on a failed write (a closed
    // pipe), and a reader that stops early is no error.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "confine", &mut script);
    print(&script)
}

/// `bytes` to standard output; a reader gone (EPIPE) is not an error.
fn print(bytes: &[u8]) -> i32 {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            eprintln!("confine: writing to standard output: {e}");
            EXIT_CONFINE_FAILED
        }
    }
}

/// `confine man [--dir DIR]`.
pub fn man(args: ManArgs) -> i32 {
    let written = match &args.dir {
        None => {
            let mut page = Vec::new();
            return match clap_mangen::Man::new(Cli::command()).render(&mut page) {
                Ok(()) => print(&page),
                Err(e) => {
                    eprintln!("confine man: {e}");
                    EXIT_CONFINE_FAILED
                }
            };
        }
        Some(dir) => write_pages(dir),
    };
    match written {
        Ok(n) => {
            if let Some(dir) = &args.dir {
                eprintln!("confine: {n} man pages written to {}", dir.display());
            }
            0
        }
        Err(e) => {
            eprintln!("confine man: {e} (pass a writable directory to --dir)");
            EXIT_CONFINE_FAILED
        }
    }
}

/// confine.1 and a page for every subcommand, nested ones included
/// (confine-audit-verify.1). Returns how many pages were written.
fn write_pages(dir: &Path) -> std::io::Result<usize> {
    std::fs::create_dir_all(dir)?;
    let mut cmd = Cli::command();
    cmd.build();
    let mut n = 0;
    write_tree(dir, &cmd, "confine", &mut n)?;
    Ok(n)
}

fn write_tree(dir: &Path, cmd: &clap::Command, name: &str, n: &mut usize) -> std::io::Result<()> {
    let page = cmd.clone().name(name.to_string());
    let mut bytes = Vec::new();
    clap_mangen::Man::new(page).render(&mut bytes)?;
    write_new(dir, &format!("{name}.1"), &bytes)?;
    *n += 1;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        write_tree(dir, sub, &format!("{name}-{}", sub.get_name()), n)?;
    }
    Ok(())
}

/// Write `dir/name` without following anything planted there: a fresh
/// temporary file (`create_new` never opens an existing one, link or not)
/// renamed over the name (rename replaces a link, it does not follow it).
/// `--dir` may be a shared directory such as /usr/local/share/man/man1.
fn write_new(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes))
        .and_then(|()| std::fs::rename(&tmp, dir.join(name)));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn script(shell: clap_complete::Shell) -> String {
        let mut out = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "confine", &mut out);
        String::from_utf8(out).unwrap()
    }

    /// bash, given the script, completes `confine <TAB>` to the subcommands
    /// and `confine run --w<TAB>` to the flag.
    #[test]
    fn bash_completes_subcommands_and_flags() {
        let complete = |words: &str, cword: usize| {
            let shell = format!(
                "source /dev/stdin; COMP_WORDS=({words}); COMP_CWORD={cword}; COMP_LINE=\"${{COMP_WORDS[*]}}\"; \
                 COMP_POINT=${{#COMP_LINE}}; \
                 _confine confine \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; printf '%s\\n' \"${{COMPREPLY[@]}}\""
            );
            let mut child = std::process::Command::new("bash")
                .args(["-c", &shell])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            std::io::Write::write_all(child.stdin.as_mut().unwrap(), script(clap_complete::Shell::Bash).as_bytes())
                .unwrap();
            drop(child.stdin.take());
            String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap()
        };
        let subcommands = complete("confine ''", 1);
        for want in ["run", "exec", "serve", "doctor", "audit", "memory", "completions", "man"] {
            assert!(subcommands.lines().any(|l| l == want), "{want} not offered: {subcommands}");
        }
        let flags = complete("confine run --works", 2);
        assert_eq!(flags.lines().collect::<Vec<_>>(), ["--workspace", "--workspace-at"], "{flags}");
        let flags = complete("confine run --workspace-", 2);
        assert_eq!(flags.trim(), "--workspace-at", "{flags}");
    }

    #[test]
    fn zsh_and_fish_scripts_name_the_subcommands() {
        let zsh = script(clap_complete::Shell::Zsh);
        assert!(zsh.starts_with("#compdef confine") && zsh.contains("'run:") && zsh.contains("'serve:"), "{zsh}");
        let fish = script(clap_complete::Shell::Fish);
        assert!(fish.contains("-a \"run\"") && fish.contains("-l workspace"), "{fish}");
    }

    /// A page for confine and every subcommand; each is a man page that
    /// `man` renders, with the subcommand's flags.
    #[test]
    fn man_pages_for_every_subcommand() {
        let dir = tempfile::tempdir().unwrap();
        let n = write_pages(dir.path()).unwrap();
        let mut cmd = Cli::command();
        cmd.build();
        let top = cmd.get_subcommands().filter(|s| s.get_name() != "help").count();
        assert!(n > top, "{n} pages for {top} subcommands");
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let page = std::fs::read_to_string(dir.path().join(format!("confine-{}.1", sub.get_name()))).unwrap();
            assert!(page.contains(".TH confine-"), "{}: {page}", sub.get_name());
        }
        let run = std::fs::read_to_string(dir.path().join("confine-run.1")).unwrap();
        assert!(run.contains("workspace") && run.contains("allow\\-degraded"), "{run}");
        assert!(dir.path().join("confine-audit-verify.1").exists());
        // A link planted under a page's name is replaced, not followed.
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "kept").unwrap();
        std::fs::remove_file(dir.path().join("confine-gc.1")).unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("confine-gc.1")).unwrap();
        write_pages(dir.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "kept");
        assert!(!std::fs::symlink_metadata(dir.path().join("confine-gc.1")).unwrap().file_type().is_symlink());
        // Rendered by man(1), where it is installed.
        if let Ok(out) = std::process::Command::new("man").arg("-l").arg(dir.path().join("confine-run.1")).output() {
            if out.status.success() {
                let text = String::from_utf8_lossy(&out.stdout);
                assert!(text.contains("SYNOPSIS") && text.contains("--workspace"), "{text}");
            }
        }
    }
}
