//! Binds as bwrap and docker users write them (issue 54): over a path of
//! a tree already bound read-only from the host (`/etc`, `/usr`), the
//! host's `/` as a source, docker's `-v`, and a cgroup parent that is not
//! there. Nothing of it may write to the host.

use crate::common;

use common::*;

/// A file over an existing file of the read-only /etc, and a directory
/// over an existing directory of the read-only /usr: there inside, and
/// the host's own untouched.
#[test]
fn binds_land_over_paths_of_the_read_only_system_trees() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hostname");
    std::fs::write(&file, "inside\n").unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("marker"), "bound\n").unwrap();
    let host_hostname = std::fs::read("/etc/hostname").ok();
    let usr_dir = ["/usr/local/share", "/usr/local", "/usr/share"]
        .into_iter()
        .find(|d| std::path::Path::new(d).is_dir())
        .expect("a directory under /usr");
    let out = run(&[
        "--ro-bind",
        &format!("{}:/etc/hostname", file.display()),
        "--bind",
        &format!("{}:{usr_dir}", data.display()),
        "--",
        "/bin/sh",
        "-c",
        &format!("cat /etc/hostname {usr_dir}/marker"),
    ]);
    assert_eq!(stdout(&out), "inside\nbound\n", "{}", stderr(&out));
    assert_eq!(std::fs::read("/etc/hostname").ok(), host_hostname, "the host's file is untouched");
    assert!(!std::path::Path::new(usr_dir).join("marker").exists());
}

/// A destination that is not there, under a tree bound read-only from the
/// host, can't get a mount point without writing to the host: the error
/// names the user's path, not the sandbox's staging directory, and the
/// host gets nothing.
#[test]
fn a_missing_destination_under_a_read_only_tree_names_the_users_path() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dest = format!("/usr/{}/x", token("nodest"));
    let out = run(&["--bind", &format!("{}:{dest}", dir.path().display()), "--", "/bin/true"]);
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains(&format!("{dest}: not in the sandbox")) && err.contains("read-only"), "{err}");
    assert!(!err.contains("/tmp/usr"), "no staging path: {err}");
    assert!(!std::path::Path::new(&dest).parent().unwrap().exists(), "nothing made on the host");
}

/// `--ro-bind /:/host` is refused however / is named, read-only or not,
/// and so is a bind over the sandbox's own root.
#[test]
fn the_hosts_root_is_never_a_bind_source() {
    if !sandbox_available() {
        return;
    }
    // The attack: a unix socket of the workspace owner's (tmux, ssh-agent)
    // on the host's root file system, which a read-only bind of / would
    // hand to the job. Refused whichever way / is named.
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("root-link");
    std::os::unix::fs::symlink("/", &link).unwrap();
    let via_link = format!("{}:/host", link.display());
    for args in
        [["--ro-bind", "/:/host"], ["--ro-bind", "/.:/host"], ["--ro-bind", via_link.as_str()], ["-v", "/:/host:ro"]]
    {
        let mut all = args.to_vec();
        all.extend(["--", "/bin/true"]);
        let out = run(&all);
        assert_eq!(out.status.code(), Some(125), "{args:?}");
        assert!(stderr(&out).contains("the host's whole root is not bound"), "{args:?}: {}", stderr(&out));
    }
    for (args, says) in [
        (["--bind", "/:/host"], "the host's whole root is not bound"),
        (["--ro-bind", "/"], "/ is the sandbox's own root"),
    ] {
        let mut all = args.to_vec();
        all.extend(["--", "/bin/true"]);
        let out = run(&all);
        assert_eq!(out.status.code(), Some(125), "{args:?}");
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
}

/// Docker's `-v SRC:DEST[:ro]` is a bind; what of docker's has no meaning
/// here is refused with a pointer to what exists.
#[test]
fn docker_volumes_are_binds() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().display().to_string();
    let out = run(&["-v", &format!("{src}:/data"), "--", "/bin/sh", "-c", "echo w > /data/f && cat /data/f"]);
    assert_eq!(stdout(&out), "w\n", "{}", stderr(&out));
    let out = run(&[
        "--volume",
        &format!("{src}:/data:ro"),
        "--",
        "/bin/sh",
        "-c",
        "cat /data/f; echo x > /data/f || echo ro",
    ]);
    assert_eq!(stdout(&out), "w\nro\n", "{}", stderr(&out));
    for (v, says) in [
        ("cache:/data".to_string(), "named volumes do not exist here"),
        ("/data".to_string(), "give SRC:DEST"),
        (format!("{src}:/data:z"), "-v takes ro or rw"),
        (format!("{src}:/data:ro:x"), "give SRC:DEST or SRC:DEST:ro"),
    ] {
        let out = run(&["-v", &v, "--", "/bin/true"]);
        assert_eq!(out.status.code(), Some(125), "{v}");
        let err = stderr(&out);
        assert!(err.contains(&format!("-v {v}: ")) && err.contains(says), "{v}: {err}");
    }
}

/// A `--cgroup-parent` that does not exist is named as such, and made by
/// nobody.
#[test]
fn a_cgroup_parent_that_is_not_there_says_so() {
    if !sandbox_available() {
        return;
    }
    let parent = format!("/{}", token("noparent"));
    let out = run(&["--cgroup-parent", &parent, "--", "/bin/true"]);
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains(&format!("cgroup parent '{parent}'")) && err.contains("does not exist"), "{err}");
    assert!(!err.contains("writable"), "{err}");
    assert!(cgroup_dirs(&|p| p.contains(&parent[1..])).is_empty(), "nothing made");
}
