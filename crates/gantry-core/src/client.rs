//! Client for the engine's Unix-socket API (used by the CLI and the desktop app).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::net::UnixStream;

use crate::api::{ApiError, SubmitRequest, Submitted};
use crate::spec::{SpecError, ValidJob, MAX_SPEC_BYTES};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no Gantry engine is running at {0}: start it with `gantry daemon` or open the Gantry app")]
    NoEngine(PathBuf),
    #[error("cannot connect to the engine at {}: {error}", socket.display())]
    Connect { socket: PathBuf, error: std::io::Error },
    #[error("the engine at {} did not answer within {}: it may be overloaded; see its log or `gantry status`", socket.display(), humantime::format_duration(*after))]
    Timeout { socket: PathBuf, after: Duration },
    #[error("{message}")]
    Api { status: u16, message: String, spec_error: Option<SpecError> },
    #[error("talking to the engine failed: {0}")]
    Protocol(String),
    #[error("{0}")]
    File(String),
}

/// A spec file checked by the engine without queueing it (the app's preview).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Preview {
    pub path: PathBuf,
    pub file_name: String,
    pub job: Option<ValidJob>,
    pub error: Option<String>,
    pub spec_error: Option<SpecError>,
}

/// Read a spec file the way every client does: size-capped UTF-8, relative mounts resolved
/// against the file's own folder.
pub fn read_spec_file(path: &Path) -> Result<SubmitRequest, ClientError> {
    let meta = std::fs::metadata(path).map_err(|e| ClientError::File(format!("cannot read {}: {e}", path.display())))?;
    if !meta.is_file() {
        return Err(ClientError::File(format!("{} is not a file", path.display())));
    }
    if meta.len() > MAX_SPEC_BYTES {
        return Err(ClientError::File(format!("the file is {} bytes; job files are limited to {MAX_SPEC_BYTES} bytes", meta.len())));
    }
    let text = std::fs::read_to_string(path).map_err(|e| ClientError::File(format!("cannot read {} as UTF-8 text: {e}", path.display())))?;
    let abs = std::fs::canonicalize(path).map_err(|e| ClientError::File(e.to_string()))?;
    Ok(SubmitRequest {
        text,
        file_name: path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        base_dir: abs.parent().map(Path::to_path_buf),
    })
}

/// How long a request (connect, send, whole answer) may take; streams only wait this long for the
/// answer to start. The engine answers in milliseconds; 30 s means it is stuck or flooded.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// While the socket's accept queue is full, retry the connect this often (within the timeout).
const CONNECT_RETRY: Duration = Duration::from_millis(50);

#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
    timeout: Duration,
}

impl Client {
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Client { socket: socket.into(), timeout: DEFAULT_TIMEOUT }
    }

    pub fn with_timeout(self, timeout: Duration) -> Self {
        Client { timeout, ..self }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `fut` within the timeout, or [`ClientError::Timeout`].
    async fn bounded<T>(&self, fut: impl Future<Output = Result<T, ClientError>>) -> Result<T, ClientError> {
        tokio::time::timeout(self.timeout, fut).await.unwrap_or_else(|_| Err(ClientError::Timeout { socket: self.socket.clone(), after: self.timeout }))
    }

    async fn connect(&self) -> Result<UnixStream, ClientError> {
        loop {
            match UnixStream::connect(&self.socket).await {
                Ok(s) => return Ok(s),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused) => {
                    return Err(ClientError::NoEngine(self.socket.clone()))
                }
                // EAGAIN: the engine's accept queue is full; it may drain.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => tokio::time::sleep(CONNECT_RETRY).await,
                Err(error) => return Err(ClientError::Connect { socket: self.socket.clone(), error }),
            }
        }
    }

    async fn send(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
        let stream = self.connect().await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| ClientError::Protocol(e.to_string()))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "gantry")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let resp = sender.send_request(req).await.map_err(|e| ClientError::Protocol(e.to_string()))?;
        if !resp.status().is_success() {
            let status = resp.status().as_u16();
            let bytes = resp.into_body().collect().await.map_err(|e| ClientError::Protocol(e.to_string()))?.to_bytes();
            return Err(match serde_json::from_slice::<ApiError>(&bytes) {
                Ok(e) => ClientError::Api { status, message: e.error, spec_error: e.spec_error },
                Err(_) => ClientError::Api { status, message: String::from_utf8_lossy(&bytes).into_owned(), spec_error: None },
            });
        }
        Ok(resp)
    }

    async fn json<T: DeserializeOwned>(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<T, ClientError> {
        let bytes = self.bytes(method, path, body).await?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Protocol(format!("unexpected reply: {e}")))
    }

    /// A whole answer, within the timeout.
    async fn bytes(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<Bytes, ClientError> {
        self.bounded(async {
            let resp = self.send(method, path, body).await?;
            Ok(resp.into_body().collect().await.map_err(|e| ClientError::Protocol(e.to_string()))?.to_bytes())
        })
        .await
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.json("GET", path, None).await
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> Result<T, ClientError> {
        let b = serde_json::to_vec(body).map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.json("POST", path, Some(b)).await
    }

    /// Stream a response body chunk by chunk (logs with follow, events). Only the start of the
    /// answer is bounded by the timeout: a stream may stay quiet for as long as the job runs.
    pub async fn stream(&self, path: &str, mut on_chunk: impl FnMut(&[u8]) -> bool) -> Result<(), ClientError> {
        let mut body = self.bounded(self.send("GET", path, None)).await?.into_body();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| ClientError::Protocol(e.to_string()))?;
            if let Some(data) = frame.data_ref() {
                if !on_chunk(data) {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Queue one spec file; returns the job ids (several for a `matrix`).
    /// Per-user usage since `since_ms` (`GET /v1/usage`): GPU-hours, jobs, mean wait, fair share.
    pub async fn usage(&self, since_ms: i64) -> Result<crate::store::UsageReport, ClientError> {
        self.get(&format!("/v1/usage?since_ms={since_ms}")).await
    }

    pub async fn submit_file(&self, path: &Path) -> Result<Vec<i64>, ClientError> {
        let req = read_spec_file(path)?;
        Ok(self.post::<_, Submitted>("/v1/jobs", &req).await?.job_ids)
    }

    /// Check one spec file without queueing it.
    pub async fn preview_file(&self, path: &Path) -> Result<Preview, ClientError> {
        let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut p = Preview { path: path.to_path_buf(), file_name, job: None, error: None, spec_error: None };
        match read_spec_file(path) {
            Err(e) => p.error = Some(e.to_string()),
            Ok(req) => match self.post::<_, ValidJob>("/v1/validate", &req).await {
                Ok(j) => p.job = Some(j),
                Err(ClientError::Api { message, spec_error, .. }) => {
                    p.error = Some(message);
                    p.spec_error = spec_error;
                }
                Err(e) => return Err(e),
            },
        }
        Ok(p)
    }

    pub async fn raw(&self, path: &str) -> Result<Vec<u8>, ClientError> {
        Ok(self.bytes("GET", path, None).await?.to_vec())
    }
}
