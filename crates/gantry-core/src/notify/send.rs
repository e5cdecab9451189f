//! Sending one notification: a webhook POST with hyper (TLS through rustls with the system's trust
//! store, so a lab's own CA works), or an email through the lab's relay with `lettre` (the same).
//! Redirects are never followed: the request goes to the checked address and nowhere else.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

use super::check::HookUrl;
use super::Login;
use crate::policy::SmtpSettings;
use crate::protocol::notify::{NotifyEvent, NotifyPayload};

/// POST `body` to the webhook at one of `addrs` (already checked). 2xx is delivered; anything else
/// (a redirect included) is a failure to try again.
pub(super) async fn webhook(u: &HookUrl, addrs: &[SocketAddr], body: &str, event: NotifyEvent) -> Result<(), String> {
    let mut last = String::from("no address");
    let mut tcp = None;
    for a in addrs {
        match tokio::net::TcpStream::connect(a).await {
            Ok(s) => {
                tcp = Some(s);
                break;
            }
            Err(e) => last = format!("cannot connect to {a}: {e}"),
        }
    }
    let tcp = tcp.ok_or(last)?;
    let id = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["id"].as_str().map(String::from))
        .unwrap_or_default();
    if u.tls {
        let name = rustls::pki_types::ServerName::try_from(u.host.clone())
            .map_err(|e| format!("TLS: {:?} is not a name a certificate can be checked for: {e}", u.host))?;
        let tls = tokio_rustls::TlsConnector::from(tls_config()?)
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS with {}: {e}", u.host))?;
        post(tls, u, body, &id, event).await
    } else {
        post(tcp, u, body, &id, event).await
    }
}

/// The TLS client settings of a webhook: rustls with `ring`, trusting the system's certificates
/// (`/etc/ssl/certs`, or `SSL_CERT_FILE`/`SSL_CERT_DIR` where set). Read at each send, as OpenSSL did, so
/// a CA the admin adds with `update-ca-certificates` counts without restarting the engine.
fn tls_config() -> Result<std::sync::Arc<rustls::ClientConfig>, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found.errors.first().map(|e| format!(": {e}")).unwrap_or_default();
        return Err(format!(
            "TLS: no trusted certificates found on this machine{why}; install the `ca-certificates` package"
        ));
    }
    // ring builds without cmake (aws-lc-rs does not); its deprecation is only for post-quantum key exchange.
    #[allow(deprecated)]
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(std::sync::Arc::new(config))
}

async fn post<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    io: S,
    u: &HookUrl,
    body: &str,
    id: &str,
    event: NotifyEvent,
) -> Result<(), String> {
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("HTTP: {e}"))?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let name = if u.host.contains(':') {
        format!("[{}]", u.host)
    } else {
        u.host.clone()
    };
    let host = if (u.tls && u.port == 443) || (!u.tls && u.port == 80) {
        name
    } else {
        format!("{name}:{}", u.port)
    };
    let req = hyper::Request::post(u.path.as_str())
        .header("host", host)
        .header("content-type", "application/json")
        .header("user-agent", concat!("gantry/", env!("CARGO_PKG_VERSION")))
        .header("gantry-event-id", id)
        .header("gantry-event", event.as_str())
        .body(Full::new(Bytes::copy_from_slice(body.as_bytes())))
        .map_err(|e| format!("HTTP: {e}"))?;
    let res = sender.send_request(req).await.map_err(|e| format!("HTTP: {e}"));
    let res = match res {
        Ok(r) => r,
        Err(e) => {
            driver.abort();
            return Err(e);
        }
    };
    let status = res.status();
    let mut text = String::new();
    if !status.is_success() {
        let got = tokio::time::timeout(std::time::Duration::from_secs(2), res.into_body().collect()).await;
        if let Ok(Ok(b)) = got {
            text = String::from_utf8_lossy(&b.to_bytes()[..]).chars().take(200).collect();
        }
    }
    driver.abort();
    if status.is_success() {
        Ok(())
    } else if status.is_redirection() {
        Err(format!(
            "the webhook answered {status} (a redirect); Gantry does not follow redirects: use the URL it redirects to"
        ))
    } else {
        Err(format!(
            "the webhook answered {status}{}",
            if text.is_empty() {
                String::new()
            } else {
                format!(": {text:?}")
            }
        ))
    }
}

/// Send `p` as an email to `to` through the lab's relay.
pub(super) async fn email(
    smtp: &SmtpSettings,
    login: Option<&Login>,
    to: &str,
    p: &NotifyPayload,
) -> Result<(), String> {
    use lettre::message::header::ContentType;
    use lettre::transport::smtp::authentication::Credentials;
    use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
    let mut b = if smtp.starttls {
        AsyncSmtpTransport::<Tokio1Executor>::starttls_relay(&smtp.host)
            .map_err(|e| format!("SMTP relay {}: {e}", smtp.host))?
    } else {
        AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&smtp.host)
    };
    b = b.port(smtp.port).timeout(Some(crate::defaults::NOTIFY_SEND_TIMEOUT));
    if let Some(l) = login {
        b = b.credentials(Credentials::new(l.user.clone(), l.password.clone()));
    }
    let domain = smtp
        .from
        .rsplit_once('@')
        .map(|(_, d)| d.to_string())
        .unwrap_or_else(|| p.host.clone());
    let mut body = format!(
        "{}\n\nevent: {}\nid: {}\nmachine: {}\n",
        p.text,
        p.event.as_str(),
        p.id,
        p.host
    );
    if let Some(j) = &p.job {
        body.push_str(&format!(
            "job: {} ({})\nowner: {}\nstate: {}\n",
            j.id, j.name, j.owner, j.state
        ));
        if let Some(c) = j.exit_code {
            body.push_str(&format!("exit code: {c}\n"));
        }
        if let Some(m) = &j.message {
            body.push_str(&format!("\n{m}\n"));
        }
    }
    let msg = Message::builder()
        .from(
            smtp.from
                .parse()
                .map_err(|e| format!("`smtp_from` {:?}: {e}", smtp.from))?,
        )
        .to(to.parse().map_err(|e| format!("{to:?}: {e}"))?)
        .subject(format!("[gantry] {}", p.text.chars().take(150).collect::<String>()))
        .message_id(Some(format!("<{}@{domain}>", p.id)))
        .header(ContentType::TEXT_PLAIN)
        .body(body)
        .map_err(|e| format!("building the email: {e}"))?;
    b.build()
        .send(msg)
        .await
        .map_err(|e| format!("SMTP relay {}:{}: {e}", smtp.host, smtp.port))?;
    Ok(())
}
