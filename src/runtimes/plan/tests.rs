use super::*;
use crate::runtimes::lookup;

fn resolved(runtime: &str, exe: &str, helpers: &[(&str, &str)]) -> Resolved {
    Resolved {
        runtime: lookup(runtime).unwrap(),
        executable: PathBuf::from(exe),
        helpers: helpers.iter().map(|(n, p)| (n.to_string(), PathBuf::from(p))).collect(),
        ro_paths: vec![],
        env: vec![],
        path_dirs: vec![],
    }
}

#[test]
fn interpreted_code_runs_from_private_tmp() {
    let p = code_plan(&resolved("python", "/usr/bin/python3", &[]), "print(1)");
    let src = p.source.as_ref().unwrap();
    assert_eq!(src.path, PathBuf::from("/tmp/confine-src/main.py"));
    assert!(src.path.starts_with("/tmp"), "never into the repository");
    assert_eq!(p.steps, [vec!["/usr/bin/python3".to_string(), "/tmp/confine-src/main.py".into()]]);
    assert_eq!(p.argv(), p.steps[0]);
}

#[test]
fn compiled_code_compiles_then_runs_in_one_shell() {
    let p = code_plan(&resolved("rust", "/root/.cargo/bin/rustc", &[]), "fn main(){}");
    assert_eq!(p.steps.len(), 2);
    assert_eq!(p.steps[1], ["/tmp/confine-src/main"]);
    assert_eq!(
        p.argv()[2],
        "'/root/.cargo/bin/rustc' '--edition' '2021' '-o' '/tmp/confine-src/main' '/tmp/confine-src/main.rs' && exec '/tmp/confine-src/main'"
    );
    let p = code_plan(&resolved("c", "/usr/bin/cc", &[]), "int main(){}");
    assert!(p.steps[0].contains(&"-lm".to_string()));
}

#[test]
fn java_uses_the_public_class_name() {
    let code = "import x;\npublic final class Hello {\n public static void main(String[] a) {}\n}";
    let p = code_plan(&resolved("java", "/usr/bin/javac", &[("java", "/usr/bin/java")]), code);
    assert_eq!(p.source.unwrap().path, PathBuf::from("/tmp/confine-src/Hello.java"));
    assert_eq!(p.steps[1], ["/usr/bin/java", "-cp", "/tmp/confine-src/classes", "Hello"]);
    let p = code_plan(&resolved("java", "/usr/bin/java", &[]), "class X {}");
    assert_eq!(p.steps, [vec!["/usr/bin/java".to_string(), "/tmp/confine-src/Main.java".into()]]);
}

#[test]
fn kotlin_and_csharp_run_their_build_products() {
    let p = code_plan(&resolved("kotlin", "/opt/kotlinc/bin/kotlinc", &[("java", "/usr/bin/java")]), "fun main(){}");
    assert_eq!(p.steps[1], ["/usr/bin/java", "-jar", "/tmp/confine-src/main.jar"]);
    let p = code_plan(&resolved("csharp", "/usr/bin/csc", &[("mono", "/usr/bin/mono")]), "class A{}");
    assert_eq!(p.source.unwrap().path, PathBuf::from("/tmp/confine-src/main.cs"));
    assert_eq!(p.steps[1], ["/usr/bin/mono", "/tmp/confine-src/main.exe"]);
    let p = code_plan(&resolved("csharp", "/usr/bin/dotnet-script", &[]), "1");
    assert_eq!(p.steps, [vec!["/usr/bin/dotnet-script".to_string(), "/tmp/confine-src/main.csx".into()]]);
    assert!(p.env.iter().any(|(k, _)| k == "DOTNET_CLI_HOME"));
}

#[test]
fn typescript_and_go_variants() {
    let p = code_plan(&resolved("typescript", "/usr/bin/node", &[]), "let x: number = 1");
    assert_eq!(p.steps[0][1], "--experimental-strip-types");
    let p = code_plan(&resolved("typescript", "/usr/bin/deno", &[]), "1");
    assert_eq!(p.steps[0][1], "run");
    let p = code_plan(&resolved("go", "/usr/bin/go", &[]), "package main");
    assert_eq!(p.steps[0][1], "run");
    assert!(p.env.contains(&("GOTOOLCHAIN".into(), "local".into())));
}

#[test]
fn args_mode_runs_the_executable_with_the_args() {
    let p = args_plan(&resolved("node", "/usr/bin/node", &[]), &["--test".into(), "a b".into()]);
    assert!(p.source.is_none());
    assert_eq!(p.argv(), ["/usr/bin/node", "--test", "a b"]);
}

#[test]
fn shell_quoting_survives_quotes() {
    assert_eq!(shell_quote("it's"), r"'it'\''s'");
    assert_eq!(java_class("class A {}"), "Main");
}
