#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use std::os::unix::fs::PermissionsExt;

fn me() -> u32 {
    nix::unistd::geteuid().as_raw()
}

fn program() -> Vec<u8> {
    (0..80u8).collect()
}

#[test]
fn round_trip_and_keys_differ_by_every_input() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = Cache::at(&tmp.path().join("seccomp"), me()).unwrap();
    let key = Cache::key("default.json", "{}", "facts");
    assert_eq!(key, Cache::key("default.json", "{}", "facts"), "keys are stable");
    assert_ne!(key, Cache::key("default.json", "{ }", "facts"));
    assert_ne!(key, Cache::key("other.json", "{}", "facts"));
    assert_ne!(key, Cache::key("default.json", "{}", "other facts"));
    assert!(cache.load(&key).is_none());
    cache.store(&key, &program());
    assert_eq!(cache.load(&key).unwrap(), program());
    let mode = fs::metadata(cache.entry(&key)).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert_eq!(fs::metadata(tmp.path().join("seccomp")).unwrap().mode() & 0o777, 0o700);
}

#[test]
fn damaged_entries_are_not_loaded() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = Cache::at(tmp.path(), me()).unwrap();
    let key = Cache::key("p", "t", "f");
    cache.store(&key, &program());
    let path = cache.entry(&key);
    let mut bytes = fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    fs::write(&path, &bytes).unwrap();
    assert!(cache.load(&key).is_none(), "a flipped bit must fail the checksum");
    fs::write(&path, &bytes[..MAGIC.len() + 10]).unwrap();
    assert!(cache.load(&key).is_none(), "a torn file must not load");
    fs::write(&path, b"not a cache entry").unwrap();
    assert!(cache.load(&key).is_none());
    cache.store(&key, &program());
    assert_eq!(cache.load(&key).unwrap(), program(), "a bad entry is replaced");

    // A valid entry of another profile, moved into this key's place.
    let other = Cache::key("p", "allow everything", "f");
    cache.store(&other, &[0u8; 8]);
    fs::rename(cache.entry(&other), cache.entry(&key)).unwrap();
    assert!(cache.load(&key).is_none(), "an entry is bound to its key");
}

#[test]
fn untrusted_directories_and_entries_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    let err = Cache::at(&dir, me()).unwrap_err();
    assert!(matches!(err, CacheError::Untrusted { .. }), "{err}");
    assert!(err.to_string().contains("chmod 700"), "{err}");
    assert!(Cache::at(&dir, me() + 1).is_err(), "another owner is refused");

    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    let cache = Cache::at(&dir, me()).unwrap();
    let key = Cache::key("p", "t", "f");
    cache.store(&key, &program());
    fs::set_permissions(cache.entry(&key), fs::Permissions::from_mode(0o666)).unwrap();
    assert!(cache.load(&key).is_none(), "a world-writable entry is not trusted");

    // A symlink planted in place of an entry is not followed.
    let target = tmp.path().join("elsewhere");
    cache.store("k2", &program());
    fs::rename(cache.entry("k2"), &target).unwrap();
    std::os::unix::fs::symlink(&target, cache.entry("k2")).unwrap();
    assert!(cache.load("k2").is_none(), "a symlinked entry is not followed");
}

#[test]
fn entries_written_by_another_uid_are_refused() {
    if !nix::unistd::geteuid().is_root() {
        assert_ne!(
            std::env::var("CONFINE_REQUIRE_ISOLATION").as_deref(),
            Ok("1"),
            "required: root, to chown a cache entry"
        );
        eprintln!("SKIPPED: needs root to chown a cache entry");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let cache = Cache::at(tmp.path(), 0).unwrap();
    let key = Cache::key("p", "t", "f");
    cache.store(&key, &program());
    nix::unistd::chown(&cache.entry(&key), Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
    assert!(cache.load(&key).is_none(), "an entry a job's uid could own is not trusted");
}

#[test]
fn the_oldest_entries_are_pruned() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = Cache::at(tmp.path(), me()).unwrap();
    for i in 0..MAX_ENTRIES + 5 {
        cache.store(&format!("k{i:03}"), &program());
    }
    let n = fs::read_dir(tmp.path()).unwrap().count();
    assert_eq!(n, MAX_ENTRIES);
}
