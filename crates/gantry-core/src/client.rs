//! Client for the engine's Unix-socket API (used by the CLI and the desktop app).

use std::path::{Path, PathBuf};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::net::UnixStream;

use crate::api::ApiError;
use crate::spec::SpecError;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no Gantry engine is running at {0}: start it with `gantry daemon` or open the Gantry app")]
    NoEngine(PathBuf),
    #[error("{message}")]
    Api { status: u16, message: String, spec_error: Option<SpecError> },
    #[error("talking to the engine failed: {0}")]
    Protocol(String),
}

#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
}

impl Client {
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Client { socket: socket.into() }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    async fn send(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
        let stream = UnixStream::connect(&self.socket).await.map_err(|_| ClientError::NoEngine(self.socket.clone()))?;
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
        let resp = self.send(method, path, body).await?;
        let bytes = resp.into_body().collect().await.map_err(|e| ClientError::Protocol(e.to_string()))?.to_bytes();
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Protocol(format!("unexpected reply: {e}")))
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.json("GET", path, None).await
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> Result<T, ClientError> {
        let b = serde_json::to_vec(body).map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.json("POST", path, Some(b)).await
    }

    /// Stream a response body chunk by chunk (logs with follow, events).
    pub async fn stream(&self, path: &str, mut on_chunk: impl FnMut(&[u8]) -> bool) -> Result<(), ClientError> {
        let mut body = self.send("GET", path, None).await?.into_body();
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

    pub async fn raw(&self, path: &str) -> Result<Vec<u8>, ClientError> {
        let resp = self.send("GET", path, None).await?;
        Ok(resp.into_body().collect().await.map_err(|e| ClientError::Protocol(e.to_string()))?.to_bytes().to_vec())
    }
}
