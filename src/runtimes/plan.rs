//! How a request runs: code mode writes the source into the sandbox's
//! private /tmp (never into the repository), compiles it where the runtime
//! needs that, then runs it; args mode runs the executable with the args.
//!
//! Pure data: this module builds argv lists and never touches the disk.

use super::toolchain::Resolved;
use super::{basename, name_matches, Runtime};
use std::path::PathBuf;

/// Where code mode puts the source and build products, inside the sandbox.
pub const SOURCE_DIR: &str = "/tmp/confine-src";

/// The default executables of `rt` in a mode: `java` runs programs, `javac`
/// compiles inline code.
pub fn default_executables(rt: &Runtime, code_mode: bool) -> &'static [&'static str] {
    match (rt.name, code_mode) {
        ("java", false) => &["java"],
        _ => rt.executables,
    }
}

/// The executable a request names, as the policy sees it (`command`): the
/// override as given, else the runtime's first default for the mode.
/// Policy runs before anything is looked up on PATH.
pub fn requested_command<'a>(rt: &Runtime, executable: Option<&'a str>, code_mode: bool) -> &'a str {
    match executable {
        Some(e) => e,
        None => default_executables(rt, code_mode).first().copied().unwrap_or(rt.name),
    }
}

/// Executables that can run inline code for `rt` (a subset of `compatible`).
pub fn code_executables(rt: &Runtime) -> &'static [&'static str] {
    match rt.name {
        "rust" => &["rustc"],
        "kotlin" => &["kotlinc", "kotlinc-jvm"],
        "csharp" => &["dotnet-script", "csc", "mcs"],
        "r" => &["Rscript", "R"],
        "elixir" => &["elixir"],
        _ => rt.compatible,
    }
}

/// Other executables the plan runs besides the main one.
pub fn helpers(rt: &Runtime, exe_name: &str, code_mode: bool) -> &'static [&'static str] {
    match rt.name {
        "java" if code_mode && name_matches(exe_name, &["javac"]) => &["java"],
        "kotlin" => &["java"],
        "csharp" if code_mode && name_matches(exe_name, &["csc", "mcs"]) => &["mono"],
        "elixir" => &["erl"],
        _ => &[],
    }
}

/// Variables a runtime needs in a sandbox whose HOME is /tmp and whose
/// network is usually off.
fn runtime_env(rt: &Runtime) -> &'static [(&'static str, &'static str)] {
    match rt.name {
        // GOTOOLCHAIN=local: never try to download another Go.
        "go" => &[
            ("GOCACHE", "/tmp/.cache/go-build"),
            ("GOPATH", "/tmp/go"),
            ("GOTOOLCHAIN", "local"),
            ("GOTELEMETRY", "off"),
        ],
        "csharp" => &[("DOTNET_CLI_HOME", "/tmp"), ("DOTNET_NOLOGO", "1"), ("DOTNET_CLI_TELEMETRY_OPTOUT", "1")],
        _ => &[],
    }
}

/// The inline source, to be written before the first step runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    /// Path inside the sandbox (under [`SOURCE_DIR`]).
    pub path: PathBuf,
    pub contents: String,
}

/// What the sandbox runs, in order, and what it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecPlan {
    pub source: Option<SourceFile>,
    /// Compile steps, then the run step; each an argv.
    pub steps: Vec<Vec<String>>,
    pub env: Vec<(String, String)>,
    pub ro_paths: Vec<PathBuf>,
    pub path_dirs: Vec<PathBuf>,
}

impl ExecPlan {
    fn from(resolved: &Resolved, source: Option<SourceFile>, steps: Vec<Vec<String>>) -> ExecPlan {
        let mut env = resolved.env.clone();
        env.extend(runtime_env(resolved.runtime).iter().map(|(k, v)| (k.to_string(), v.to_string())));
        ExecPlan { source, steps, env, ro_paths: resolved.ro_paths.clone(), path_dirs: resolved.path_dirs.clone() }
    }

    /// One argv for the whole plan: the step itself when there is one,
    /// else `/bin/sh -c 'step1 && … && exec last'`, so a failed compile
    /// ends the job with the compiler's status.
    pub fn argv(&self) -> Vec<String> {
        match self.steps.as_slice() {
            [one] => one.clone(),
            steps => {
                let script = steps
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let words = s.iter().map(|w| shell_quote(w)).collect::<Vec<_>>().join(" ");
                        if i + 1 == steps.len() {
                            format!("exec {words}")
                        } else {
                            words
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(" && ");
                vec!["/bin/sh".into(), "-c".into(), script]
            }
        }
    }
}

/// Quote a word for `sh`: single quotes, with `'` spelled `'\''`.
pub fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// Args mode: the executable with the caller's arguments.
pub fn args_plan(resolved: &Resolved, args: &[String]) -> ExecPlan {
    let mut argv = vec![resolved.executable.to_string_lossy().into_owned()];
    argv.extend(args.iter().cloned());
    ExecPlan::from(resolved, None, vec![argv])
}

/// The class javac must be given the file name of: the public top-level
/// class, else `Main`.
fn java_class(code: &str) -> String {
    let words: Vec<&str> = code.split_whitespace().collect();
    for (i, w) in words.iter().enumerate() {
        if *w == "class" && words[i.saturating_sub(2)..i].contains(&"public") {
            if let Some(next) = words.get(i + 1) {
                let name: String = next.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$').collect();
                if !name.is_empty() {
                    return name;
                }
            }
        }
    }
    "Main".into()
}

/// Code mode: write the source under [`SOURCE_DIR`], compile if needed, run.
pub fn code_plan(resolved: &Resolved, code: &str) -> ExecPlan {
    let rt = resolved.runtime;
    let exe = resolved.executable.to_string_lossy().into_owned();
    let name = basename(&exe).to_string();
    let is = |candidates: &[&str]| name_matches(&name, candidates);
    let dir = PathBuf::from(SOURCE_DIR);
    let at = |file: &str| dir.join(file).to_string_lossy().into_owned();
    let helper = |h: &str| resolved.helper(h).map_or_else(|| h.to_string(), |p| p.to_string_lossy().into_owned());
    let mut file = rt.source_file.to_string();
    let steps: Vec<Vec<String>> = match rt.name {
        "node" | "typescript" if is(&["deno"]) => vec![vec![exe, "run".into(), at(&file)]],
        "typescript" if is(&["node", "nodejs"]) => {
            vec![vec![exe, "--experimental-strip-types".into(), at(&file)]]
        }
        "go" => vec![vec![exe, "run".into(), at(&file)]],
        "java" => {
            file = format!("{}.java", java_class(code));
            if is(&["javac"]) {
                let out = at("classes");
                vec![
                    vec![exe, "-d".into(), out.clone(), at(&file)],
                    vec![helper("java"), "-cp".into(), out, java_class(code)],
                ]
            } else {
                // `java Main.java`: the JDK's single-file source launcher.
                vec![vec![exe, at(&file)]]
            }
        }
        "kotlin" => {
            let jar = at("main.jar");
            vec![
                vec![exe, at(&file), "-include-runtime".into(), "-d".into(), jar.clone()],
                vec![helper("java"), "-jar".into(), jar],
            ]
        }
        "rust" => {
            let bin = at("main");
            vec![vec![exe, "--edition".into(), "2021".into(), "-o".into(), bin.clone(), at(&file)], vec![bin]]
        }
        "c" | "cpp" => {
            let bin = at("main");
            let mut compile = vec![exe, "-o".into(), bin.clone(), at(&file)];
            if rt.name == "c" {
                compile.push("-lm".into());
            }
            vec![compile, vec![bin]]
        }
        "csharp" if is(&["csc", "mcs"]) => {
            file = "main.cs".into();
            let out = at("main.exe");
            vec![vec![exe, format!("-out:{out}"), at(&file)], vec![helper("mono"), out]]
        }
        "r" if is(&["R"]) => vec![vec![exe, "--no-save".into(), "--no-restore".into(), "-f".into(), at(&file)]],
        _ => vec![vec![exe, at(&file)]],
    };
    let source = SourceFile { path: dir.join(&file), contents: code.to_string() };
    ExecPlan::from(resolved, Some(source), steps)
}

#[cfg(test)]
mod tests;
