use super::*;

#[test]
fn discovery_prefers_the_state_dir_then_a_live_system_engine_then_the_users_own() {
    let sys = Path::new("/run/gantry/gantry.sock");
    let user = PathBuf::from("/home/a/.local/state/gantry");
    let d = |explicit: Option<&str>, answers| discover(explicit.map(PathBuf::from), sys, answers, user.clone());
    assert_eq!(
        d(Some("/srv/q"), true),
        (PathBuf::from("/srv/q/gantry.sock"), FoundBy::StateDir)
    );
    assert_eq!(d(None, true), (sys.to_path_buf(), FoundBy::System));
    assert_eq!(d(None, false), (user.join("gantry.sock"), FoundBy::User));
}

#[test]
fn a_host_that_ssh_would_read_as_an_option_is_refused() {
    assert!(matches!(Target::ssh("alice@ws1"), Ok(Target::Ssh { host, .. }) if host == "alice@ws1"));
    for bad in ["-oProxyCommand=touch /tmp/x", "", "ws1 rm", "a\nb"] {
        assert!(Target::ssh(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn events_are_read_line_by_line_across_chunks_and_unknown_lines_skipped() {
    let stream = b"{\"kind\":\"job\",\"job_id\":1,\"state\":\"running\",\"at\":5}\n{\"kind\":\"later\"}\n{\"kind\":\"job\",\"job_id\":2,\"state\":\"queued\",\"at\":6}\n";
    let (mut buf, mut seen) = (Vec::new(), vec![]);
    for chunk in stream.chunks(7) {
        assert!(for_each_line(&mut buf, chunk, &mut |ev: EngineEvent| {
            if let EngineEvent::Job { job_id, state, .. } = ev {
                seen.push((job_id, state));
            }
            true
        }));
    }
    assert_eq!(seen, [(1, JobState::Running), (2, JobState::Queued)]);
    assert!(buf.is_empty());
    // `false` stops at once.
    assert!(!for_each_line(&mut Vec::new(), stream, &mut |_: EngineEvent| false));
}

/// What the stand-in engine does with the next connection.
enum Turn {
    /// Read the request, then hang up without answering (a crash after the commit).
    HangUp,
    Answer(u16, &'static str),
    /// No socket for a moment (the engine restarting); no connection taken.
    Gone,
}

/// A stand-in engine listening on `sock` (from now on), taking `turns`; returns the requests it read.
fn engine(sock: PathBuf, turns: Vec<Turn>) -> tokio::task::JoinHandle<Vec<SubmitRequest>> {
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    tokio::spawn(serve(listener, sock, turns))
}

async fn serve(mut listener: tokio::net::UnixListener, sock: PathBuf, turns: Vec<Turn>) -> Vec<SubmitRequest> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut seen = vec![];
    for turn in turns {
        if let Turn::Gone = turn {
            drop(listener);
            std::fs::remove_file(&sock).unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
            listener = tokio::net::UnixListener::bind(&sock).unwrap();
            continue;
        }
        let (mut c, _) = listener.accept().await.unwrap();
        let mut buf = vec![];
        let body = loop {
            let mut chunk = [0u8; 4096];
            let n = c.read(&mut chunk).await.unwrap();
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                if body.len() >= len {
                    break body.to_string();
                }
            }
            assert!(n > 0, "the client hung up mid-request");
        };
        seen.push(serde_json::from_str(&body).unwrap());
        if let Turn::Answer(status, answer) = turn {
            let head = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                answer.len()
            );
            c.write_all(format!("{head}{answer}").as_bytes()).await.unwrap();
            let _ = c.read(&mut [0u8; 16]).await; // until the client closes
        }
    }
    seen
}

fn spec() -> SubmitRequest {
    SubmitRequest {
        text: "image: a\n".into(),
        file_name: "a.yaml".into(),
        base_dir: None,
        idempotency_key: None,
        origin: Default::default(),
        begin: None,
    }
}

#[tokio::test]
async fn a_submit_whose_answer_is_lost_is_sent_once_more_with_the_same_key_once_the_engine_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("gantry.sock");
    let server = engine(
        sock.clone(),
        vec![
            Turn::HangUp,
            Turn::Gone,
            Turn::Answer(200, r#"{"job_id":7,"job_ids":[7]}"#),
        ],
    );
    let got = Client::new(&sock).submit(&spec()).await.unwrap();
    assert_eq!(got.job_ids, [7]);
    let seen = server.await.unwrap();
    let keys: Vec<_> = seen.iter().map(|r| r.idempotency_key.clone()).collect();
    assert_eq!(keys.len(), 2);
    assert!(keys[0].as_ref().is_some_and(|k| k.len() == 32), "a fresh key: {keys:?}");
    assert_eq!(keys[0], keys[1], "sent again with the same key");
    assert_ne!(new_submit_key(), new_submit_key());
}

#[tokio::test]
async fn a_submit_is_sent_again_only_once_and_never_after_an_answer() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("twice.sock");
    let server = engine(sock.clone(), vec![Turn::HangUp, Turn::HangUp]);
    let err = Client::new(&sock).submit(&spec()).await.unwrap_err();
    assert!(matches!(err, ClientError::Interrupted(_)), "{err}");
    assert_eq!(server.await.unwrap().len(), 2, "once more, not again");

    let sock = dir.path().join("refused.sock");
    let server = engine(sock.clone(), vec![Turn::Answer(500, r#"{"error":"queue full"}"#)]);
    let err = Client::new(&sock)
        .with_timeout(Duration::from_secs(2))
        .submit(&SubmitRequest {
            idempotency_key: Some("mine-1234".into()),
            ..spec()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Api { status: 500, message, .. } if message == "queue full"),
        "{err}"
    );
    let seen = server.await.unwrap();
    assert_eq!(seen.len(), 1, "an answer is never sent again");
    assert_eq!(
        seen[0].idempotency_key.as_deref(),
        Some("mine-1234"),
        "the caller's own key is kept"
    );
}

#[test]
fn the_header_names_the_engine() {
    let home = Path::new("/home/alice");
    let found = |by, s: &str| {
        EngineRef::Found {
            by,
            socket: PathBuf::from(s),
        }
        .label(home)
    };
    assert_eq!(
        found(FoundBy::System, "/run/gantry/gantry.sock"),
        "System engine (/run/gantry/gantry.sock)"
    );
    assert_eq!(
        found(FoundBy::User, "/home/alice/.local/state/gantry/gantry.sock"),
        "Your engine (~/.local/state/gantry)"
    );
    assert_eq!(found(FoundBy::StateDir, "/srv/q/gantry.sock"), "Engine in /srv/q");
    let embedded = |gpus: Option<&str>| {
        EngineRef::Embedded {
            socket: PathBuf::from("/x/gantry.sock"),
            gpus: gpus.map(String::from),
        }
        .label(home)
    };
    assert_eq!(
        embedded(Some("sim:4x24GiB")),
        "Engine in this app (simulated GPUs 4x24GiB)"
    );
    assert_eq!(embedded(None), "Engine in this app (this machine's GPUs)");
    let bob = Holder {
        uid: 1002,
        pid: 77,
        socket: Some(PathBuf::from("/home/bob/.local/state/gantry/gantry.sock")),
        user: "bob".into(),
    };
    assert_eq!(EngineRef::Holder(bob.clone()).label(home), "Engine of bob");
    let v = EngineRef::Blocked(bob).view();
    assert_eq!((v.kind.as_str(), v.socket), ("blocked", None));
    assert!(v.problem.unwrap().starts_with(
        "the Gantry engine of bob (pid 77, socket /home/bob/.local/state/gantry/gantry.sock) already manages"
    ));
}
