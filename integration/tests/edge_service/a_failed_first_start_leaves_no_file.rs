//! A store created on a full disk fails to open, and leaves nothing that would keep it from
//! opening once space is back: the file it created is removed, an empty file it found is emptied
//! again. (A failed first start used to leave a file of zeros that every later open refused as
//! "not a redb database".) Also through the example service: its first start on a full disk
//! exits 1, and it starts once space is back.
//!
//! The full disk is a small tmpfs the test mounts, which needs root (CAP_SYS_ADMIN). Where it
//! cannot mount one the test says so and passes, unless `IDEM_REQUIRE_MOUNT=1` (CI sets it), in
//! which case it fails.
#![cfg(target_os = "linux")]

#[cfg(feature = "http")]
use crate::edge_example;
use crate::tmpfs;

use idem::{ExecuteAnswer, Request, Response, Scope, Store};
use tmpfs::Tmpfs;

fn claim(store: &Store) -> ExecuteAnswer {
    let req = Request::from_canonical_bytes(Scope::new("t", "op"), "k", b"p");
    store
        .execute(req, |_| Ok(Response::new(201, "done")))
        .expect("execute")
}

#[test]
fn a_store_created_on_a_full_disk_leaves_nothing_and_opens_once_space_is_back() {
    let Some(fs) = Tmpfs::mount(&tmpfs::journal_and(1)) else {
        return;
    };
    let path = fs.path().join("idem.redb");
    let filler = fs.fill();

    let failed = Store::open(&path);
    assert!(failed.is_err(), "a store cannot be created on a full disk");
    assert!(
        !path.exists(),
        "the failed open removed the file it created ({:?} bytes left)",
        std::fs::metadata(&path).map(|m| m.len())
    );
    let left: Vec<_> = std::fs::read_dir(fs.path())
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| *p != filler)
        .collect();
    assert!(
        left.is_empty(),
        "nothing else is left either (a journal, its temporary copy): {left:?}"
    );

    // An empty file made beforehand (a deployment step) is emptied again, not removed.
    std::fs::File::create(&path).expect("touch");
    assert!(Store::open(&path).is_err());
    assert_eq!(
        std::fs::metadata(&path).expect("still there").len(),
        0,
        "the failed open emptied the file it found empty"
    );

    std::fs::remove_file(&filler).expect("space is back");
    let store = Store::open(&path).expect("the store opens once space is back");
    assert!(matches!(claim(&store), ExecuteAnswer::Ran(_)));
    drop(store);
    let store = Store::open(&path).expect("and reopens");
    assert!(matches!(claim(&store), ExecuteAnswer::Replayed(_)));
}

#[cfg(feature = "http")]
#[test]
fn the_example_service_starts_once_space_is_back_after_a_first_start_on_a_full_disk() {
    let Some(fs) = Tmpfs::mount(&tmpfs::journal_and(1)) else {
        return;
    };
    let data = fs.path().join("data");
    std::fs::create_dir(&data).expect("data dir");
    let filler = fs.fill();

    use std::process::{Command, Stdio};
    let first = Command::new(edge_example::example_binary())
        .arg("--data")
        .arg(&data)
        .args(["--listen", "127.0.0.1:0"])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("run the service");
    assert_eq!(
        first.status.code(),
        Some(1),
        "the first start on a full disk fails: {}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(!data.join("idem.redb").exists(), "and leaves no store file");

    std::fs::remove_file(&filler).expect("space is back");
    let (mut server, _addr, _lines) = edge_example::spawn(&data, &[]);
    server.kill().expect("stop");
    server.wait().expect("reap");
}
