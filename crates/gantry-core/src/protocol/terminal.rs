//! The framing of an attached terminal (`gantry shell`, `gantry attach`): what travels over the
//! connection once `GET /v1/jobs/{id}/attach` has been upgraded ([`super::routes::ATTACH`]).
//!
//! The client sends `GET /v1/jobs/7/attach` with `Connection: upgrade` and `Upgrade:`
//! [`UPGRADE`]; the engine answers `101 Switching Protocols` (or an ordinary error: not yours, not a
//! session, still queued) and from then on both sides write frames, and nothing else:
//!
//! ```text
//! +------+----------------+-------------------+
//! | kind | length (u32 BE) | payload (length) |
//! +------+----------------+-------------------+
//! ```
//!
//! | kind | direction | payload |
//! |---|---|---|
//! | 0 `Data` | both | bytes for the terminal: keys typed (client → engine), the shell's output (engine → client) |
//! | 1 `Resize` | client → engine | columns then rows, each u16 BE (4 bytes) |
//! | 2 `Notice` | engine → client | UTF-8 text for the person at the terminal (attached, the session's end is near); the client shows it on a line of its own |
//! | 3 `Ended` | engine → client | JSON [`SessionEnd`]: the session is over; the engine closes the connection after it |
//!
//! A payload is at most [`MAX_PAYLOAD`] bytes; a longer length, or an unknown kind, ends the
//! connection (the other side is not speaking this protocol). Detaching is the client's own doing
//! (it closes the connection): the engine never ends a session because a connection went away.

use serde::{Deserialize, Serialize};

use super::JobState;

/// The `Upgrade:` token of an attach request and its `101` answer.
pub const UPGRADE: &str = "gantry-terminal/1";
/// The largest payload of one frame.
pub const MAX_PAYLOAD: usize = 64 * 1024;
const HEADER: usize = 5;

/// One frame of an attached terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Data(Vec<u8>),
    Resize { cols: u16, rows: u16 },
    Notice(String),
    Ended(SessionEnd),
}

/// How a session ended, in its last frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionEnd {
    pub state: JobState,
    pub exit_code: Option<i64>,
    /// What the engine says of it ("timed out after 2h", "exited 0").
    pub message: String,
}

/// `POST /v1/jobs/{id}/open` ([`super::routes::OPEN`]): which of the job's `ports` (default: its first).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OpenRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

/// A job's port reachable on the engine's machine: `address` is a loopback address only the job's
/// owner may connect to, for as long as the job runs; `url` is what to open (with a notebook's token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Opened {
    pub job_id: i64,
    /// The port inside the container.
    pub port: u16,
    /// On the engine's machine: `127.A.B.C:1021`, the job's own loopback address and the lab's
    /// `[sessions] forward_port` (only root may bind it); `127.0.0.1:PORT` from an engine that is not root.
    pub address: String,
    pub url: String,
}

/// The frame's bytes do not follow the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the terminal connection sent something that is not a Gantry terminal frame: {0}")]
pub struct BadFrame(pub String);

impl Frame {
    /// The frame on the wire. A `Data` payload over [`MAX_PAYLOAD`] is cut into several frames.
    pub fn encode(&self) -> Vec<u8> {
        let (kind, payload): (u8, std::borrow::Cow<[u8]>) = match self {
            Frame::Data(d) if d.len() > MAX_PAYLOAD => {
                return d
                    .chunks(MAX_PAYLOAD)
                    .flat_map(|c| Frame::Data(c.to_vec()).encode())
                    .collect();
            }
            Frame::Data(d) => (0, d.into()),
            Frame::Resize { cols, rows } => (1, [cols.to_be_bytes(), rows.to_be_bytes()].concat().into()),
            Frame::Notice(t) => (2, t.as_bytes()[..t.len().min(MAX_PAYLOAD)].to_vec().into()),
            Frame::Ended(end) => (3, serde_json::to_vec(end).unwrap_or_default().into()),
        };
        let mut out = Vec::with_capacity(HEADER + payload.len());
        out.push(kind);
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&payload);
        out
    }
}

/// Reads frames out of a byte stream that arrives in arbitrary pieces.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    /// Add what was read; returns every frame now complete (a partial one waits for more).
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<Frame>, BadFrame> {
        self.buf.extend_from_slice(bytes);
        let mut out = vec![];
        let mut at = 0;
        while self.buf.len() - at >= HEADER {
            let kind = self.buf[at];
            let len = u32::from_be_bytes(self.buf[at + 1..at + HEADER].try_into().expect("4 bytes")) as usize;
            if len > MAX_PAYLOAD {
                return Err(BadFrame(format!("a frame of {len} bytes (at most {MAX_PAYLOAD})")));
            }
            if self.buf.len() - at - HEADER < len {
                break;
            }
            let p = &self.buf[at + HEADER..at + HEADER + len];
            out.push(match kind {
                0 => Frame::Data(p.to_vec()),
                1 if len == 4 => Frame::Resize {
                    cols: u16::from_be_bytes([p[0], p[1]]),
                    rows: u16::from_be_bytes([p[2], p[3]]),
                },
                2 => Frame::Notice(String::from_utf8_lossy(p).into_owned()),
                3 => Frame::Ended(
                    serde_json::from_slice(p).map_err(|e| BadFrame(format!("an end that is not JSON: {e}")))?,
                ),
                k => return Err(BadFrame(format!("kind {k} with {len} bytes"))),
            });
            at += HEADER + len;
        }
        self.buf.drain(..at);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_survive_any_split_of_the_stream() {
        let end = SessionEnd {
            state: JobState::Succeeded,
            exit_code: Some(0),
            message: "exited 0".into(),
        };
        let frames = vec![
            Frame::Data(b"echo hi\r".to_vec()),
            Frame::Resize { cols: 132, rows: 43 },
            Frame::Notice("this session ends in 5 min".into()),
            Frame::Data(vec![]),
            Frame::Ended(end),
        ];
        let wire: Vec<u8> = frames.iter().flat_map(Frame::encode).collect();
        for piece in [1, 2, 3, 5, 7, 64, wire.len()] {
            let mut d = Decoder::default();
            let mut got = vec![];
            for chunk in wire.chunks(piece) {
                got.extend(d.push(chunk).unwrap());
            }
            assert_eq!(got, frames, "in pieces of {piece}");
            assert!(d.buf.is_empty());
        }
    }

    #[test]
    fn big_data_is_cut_and_what_is_not_a_frame_is_refused() {
        let big = vec![7u8; MAX_PAYLOAD * 2 + 10];
        let mut d = Decoder::default();
        let got = d.push(&Frame::Data(big.clone()).encode()).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(
            got.iter()
                .flat_map(|f| if let Frame::Data(b) = f { b.clone() } else { vec![] })
                .collect::<Vec<_>>(),
            big
        );
        let rows: Vec<(&[u8], &str)> = vec![
            (&[9, 0, 0, 0, 0], "kind 9"),
            (&[0, 0, 0x10, 0, 1], "at most"),
            (&[1, 0, 0, 0, 3, 1, 2, 3], "kind 1 with 3 bytes"),
            (&[3, 0, 0, 0, 1, b'x'], "not JSON"),
        ];
        for (bytes, want) in rows {
            let e = Decoder::default().push(bytes).unwrap_err();
            assert!(e.to_string().contains(want), "{bytes:?}: {e}");
        }
        assert_eq!(
            Decoder::default().push(&[0, 0, 0]).unwrap(),
            vec![],
            "a header still coming"
        );
    }
}
