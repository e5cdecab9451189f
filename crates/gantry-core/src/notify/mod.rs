//! Notifications (issue 20): users' targets (`gantry notify add email|webhook`), the lab's own
//! webhooks, and the one owned task that delivers them.
//!
//! Durable and exactly once as far as a sender can make it: the event is written in the very
//! transaction of the state change it reports (`store::notify::on_transition`, the outbox), so a
//! crash keeps both or neither. The delivery task expands each event into one delivery per
//! matching target (one transaction; `UNIQUE (event, target)`), sends, and marks the delivery sent
//! after the target accepted it. The one window left is between the target's "OK" and that commit:
//! a crash there sends the same notification again after the restart, with the same id (the
//! webhook's `id` and `Gantry-Event-Id` header, the email's `Message-ID`), so a receiver can drop
//! the copy. A failed send is tried again with exponential backoff up to `max_tries`, then given
//! up (logged, and shown in `gantry notify log`); at most `max_pending` wait per user.
//!
//! Store problems cannot go through the store (it is what fails): the lab's webhooks that list
//! `store_problem` are sent to from memory, once per problem.

pub mod check;
mod send;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{error, info, warn};

use crate::defaults::{NOTIFY_BACKOFF_MAX, NOTIFY_KEEP, NOTIFY_PARALLEL, NOTIFY_SEND_TIMEOUT};
use crate::engine::{Engine, EngineError};
use crate::policy::NotifySettings;
use crate::protocol::notify::{
    NotifyAdd, NotifyDelivery, NotifyEvent, NotifyJob, NotifyPayload, NotifyTarget, Subscription, PAYLOAD_SCHEMA,
};
use crate::store::notify::NewEvent;
use crate::store::{Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// The request cannot be carried out as asked (a host not on the list, no relay, ...).
    #[error("{0}")]
    Refused(String),
    /// Not the caller's to ask for (another user's job).
    #[error("{0}")]
    Forbidden(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// The SMTP relay's login, read once at start.
#[derive(Clone)]
pub(crate) struct Login {
    pub user: String,
    pub password: String,
}

/// Users' targets and the delivery task's state: one per engine, shared by the API and the task.
pub struct Notifier {
    settings: NotifySettings,
    login: Option<Login>,
    /// Its own connection to the engine's database (the outbox tables only).
    store: Mutex<Store>,
    db_uid: String,
    host: String,
    /// When each user's recent `notify test` calls were made (ms), for `max_tests_per_hour`.
    tests: Mutex<std::collections::HashMap<u32, Vec<i64>>>,
}

const HOUR_MS: i64 = 3_600_000;

impl Notifier {
    /// The notifier of `engine`, with the lab's `[notify]`. Refuses (the engine does not start)
    /// an SMTP credentials file that others could read or that belongs to someone else.
    pub fn open(engine: &Engine) -> Result<Notifier, EngineError> {
        let settings = engine.cfg.lab.notify.clone();
        let login = match settings.smtp.as_ref().and_then(|s| s.credentials.as_ref()) {
            Some(p) => Some(read_login(p).map_err(EngineError::Refused)?),
            None => None,
        };
        let store = Store::open(&engine.cfg.paths.db())?;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into());
        Ok(Notifier {
            settings,
            login,
            store: Mutex::new(store),
            db_uid: engine.db_uid.clone(),
            host,
            tests: Mutex::default(),
        })
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The id of one event's delivery to one target: stable across tries and restarts.
    fn id_of(&self) -> impl Fn(i64, i64) -> String + '_ {
        move |event, sub| format!("{}-{event}-{sub}", self.db_uid)
    }

    /// `gantry notify add`: check the target as the lab requires, then subscribe `uid`.
    pub async fn add(
        &self,
        engine: &Engine,
        uid: u32,
        owner: &str,
        req: NotifyAdd,
    ) -> Result<Subscription, NotifyError> {
        let on = if req.on.is_empty() {
            NotifyEvent::DEFAULT_ON.to_vec()
        } else {
            req.on.clone()
        };
        if let Some(e) = on
            .iter()
            .find(|e| matches!(e, NotifyEvent::StoreProblem | NotifyEvent::Test))
        {
            return Err(NotifyError::Refused(format!(
                "`{}` is not an event you can subscribe to ({}); use some of: started, finished, failed, timed_out, cancelled, preempted, session_idle, booking_starting, booking_released",
                e.as_str(),
                if *e == NotifyEvent::Test { "`gantry notify test` sends one to every target" } else { "the lab's own webhooks get it" }
            )));
        }
        if let Some(job) = req.job {
            let j = engine.job_detail(job)?.job;
            if j.owner_uid != uid {
                return Err(NotifyError::Forbidden(format!(
                    "job {job} belongs to {}; you can only be notified of your own jobs",
                    j.owner
                )));
            }
        }
        match &req.target {
            NotifyTarget::Email { address } => {
                let Some(smtp) = &self.settings.smtp else {
                    return Err(NotifyError::Refused(
                        "this lab has no email relay, so Gantry cannot send email; ask the lab's admin to set `smtp_host` and `smtp_from` in [notify] of the lab config, or use a webhook".into(),
                    ));
                };
                check::email(address).map_err(NotifyError::Refused)?;
                let admin = engine.policy().is_admin(uid);
                check::email_allowed(address, owner, admin, &self.email_domains(smtp), self.settings.email_to)
                    .map_err(NotifyError::Refused)?;
            }
            NotifyTarget::Webhook { url } => {
                self.webhook_addresses(url).await.map_err(NotifyError::Refused)?;
            }
        }
        let (target, max) = (req.target.clone(), self.settings.max_targets);
        let owner = owner.to_string();
        let added = self.store().notify_subscribe(uid, &owner, &target, &on, req.job, max)?;
        match added {
            Some(s) => {
                info!(uid, "notifications: {owner} added {} {}", s.target.kind(), shown(s.target.address()));
                Ok(s)
            }
            None => Err(NotifyError::Refused(format!("you have {max} notification targets, the lab's limit (`[notify] max_targets`); remove one with `gantry notify rm ID`"))),
        }
    }

    /// The domains email targets may be at: the lab's list, else the domain of `smtp_from`.
    fn email_domains(&self, smtp: &crate::policy::SmtpSettings) -> Vec<String> {
        self.settings.email_domains.clone().unwrap_or_else(|| {
            smtp.from
                .rsplit_once('@')
                .map(|(_, d)| vec![d.to_ascii_lowercase()])
                .unwrap_or_default()
        })
    }

    /// Where a webhook may be sent: its host must be on the lab's list, and every address it
    /// resolves to allowed ([`check::addresses_allowed`]).
    async fn webhook_addresses(&self, url: &str) -> Result<(check::HookUrl, Vec<std::net::SocketAddr>), String> {
        let u = check::url_syntax(url).map_err(|why| format!("the webhook URL {why}"))?;
        if !check::host_allowed(&self.settings.webhook_hosts, &u.host, u.port) {
            let list = if self.settings.webhook_hosts.is_empty() {
                "none".to_string()
            } else {
                self.settings.webhook_hosts.join(", ")
            };
            return Err(format!(
                "webhooks to {}:{} are not allowed on this machine: the lab allows only these hosts (`[notify] webhook_hosts`): {list}; ask the lab's admin to add it",
                u.host, u.port
            ));
        }
        let resolved: Vec<std::net::SocketAddr> =
            match tokio::time::timeout(NOTIFY_SEND_TIMEOUT, tokio::net::lookup_host((u.host.as_str(), u.port))).await {
                Ok(Ok(a)) => a.collect(),
                Ok(Err(e)) => return Err(format!("cannot resolve {}: {e}", u.host)),
                Err(_) => return Err(format!("resolving {} took too long", u.host)),
            };
        let addrs = check::addresses_allowed(&self.settings.webhook_hosts, &u.host, &resolved, is_this_machine)?;
        Ok((u, addrs))
    }

    /// `uid`'s targets and the lab's webhooks.
    pub fn list(&self, uid: u32) -> Result<Vec<Subscription>, NotifyError> {
        Ok(self.store().notify_subscriptions(uid)?)
    }

    /// `gantry notify rm`: only the caller's own.
    pub fn remove(&self, uid: u32, id: i64) -> Result<bool, NotifyError> {
        Ok(self.store().notify_unsubscribe(uid, id)?)
    }

    /// `gantry notify test`: one test notification to each of `uid`'s targets; their deliveries.
    pub fn test(&self, uid: u32, owner: &str) -> Result<Vec<NotifyDelivery>, NotifyError> {
        let mut st = self.store();
        if !st.notify_subscriptions(uid)?.iter().any(|s| s.owner.is_some()) {
            return Err(NotifyError::Refused("you have no notification targets; add one with `gantry notify add email ADDRESS` or `gantry notify add webhook URL`".into()));
        }
        // At most `max_tests_per_hour` per user (the lab's relay is not a mail cannon).
        {
            let now = crate::clock::now_ms();
            let max = self.settings.max_tests_per_hour;
            let mut tests = self.tests.lock().unwrap_or_else(|p| p.into_inner());
            let mine = tests.entry(uid).or_default();
            mine.retain(|t| *t > now - HOUR_MS);
            if mine.len() >= max {
                let again = mine.iter().min().map(|t| t + HOUR_MS - now).unwrap_or(0);
                return Err(NotifyError::Refused(format!(
                    "you sent {} test notifications in the last hour, the lab's limit (`[notify] max_tests_per_hour`); try again in {} (`gantry notify log` shows how the last ones went)",
                    mine.len(),
                    crate::units::duration_brief_ms(again.max(1000))
                )));
            }
            mine.push(now);
        }
        st.notify_record(NotifyEvent::Test, None, Some(uid), Some(owner))?;
        let made = self.expand(&mut st)?;
        let log = st.notify_log(Some(uid), made.max(1), self.id_of())?;
        Ok(log.into_iter().filter(|d| d.event == NotifyEvent::Test).collect())
    }

    /// `gantry notify log`: `uid`'s deliveries (root: the lab's too), newest first.
    pub fn log(&self, uid: u32, limit: usize) -> Result<Vec<NotifyDelivery>, NotifyError> {
        let st = self.store();
        let mut out = st.notify_log(Some(uid), limit, self.id_of())?;
        if uid == 0 {
            out.extend(st.notify_log(None, limit, self.id_of())?);
        }
        Ok(out)
    }

    fn expand(&self, st: &mut Store) -> Result<usize, StoreError> {
        st.notify_expand(200, self.settings.max_pending, self.id_of(), |ev, _sub, sub_uid, id| {
            self.payload(ev, sub_uid, id)
        })
    }

    /// The body of one delivery (JSON, schema `gantry.notification/1`). The lab's webhooks get a
    /// job's public fields only; its owner also gets why it ended.
    fn payload(&self, ev: &NewEvent, sub_uid: Option<u32>, id: &str) -> String {
        let job = ev.job.as_ref().map(|j| NotifyJob {
            id: j.id,
            name: j.name.clone(),
            owner: j.owner.clone(),
            state: state_of(ev.kind).unwrap_or(j.state.as_str()).to_string(),
            exit_code: j
                .exit_code
                .filter(|_| ev.kind.is_job_event() && ev.kind != NotifyEvent::Started),
            message: if sub_uid.is_some() {
                ev.text.clone().or_else(|| j.message.clone())
            } else {
                None
            },
        });
        let text = text_of(
            ev.kind,
            job.as_ref(),
            ev.text.as_deref().filter(|_| sub_uid.is_some() || ev.job.is_none()),
            &self.host,
        );
        let p = NotifyPayload {
            schema: PAYLOAD_SCHEMA.into(),
            id: id.into(),
            event: ev.kind,
            at: ev.at,
            host: self.host.clone(),
            job,
            text,
        };
        serde_json::to_string(&p).unwrap_or_default()
    }

    /// The delivery task: expands new events and sends what is due, until the engine stops.
    pub async fn run(self: Arc<Self>, engine: Arc<Engine>) {
        let hooks = self.settings.webhooks.clone();
        loop {
            let n = self.clone();
            let h = hooks.clone();
            match tokio::task::spawn_blocking(move || n.store().notify_sync_lab(&h)).await {
                Ok(Ok(())) => break,
                Ok(Err(e)) => {
                    error!("notifications: cannot record the lab's webhooks ({e}); trying again");
                }
                Err(e) => error!("notifications: {e}"),
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = engine.stopped() => return,
            }
        }
        // Once per episode (from no problem to one): its wording changes as different writes fail.
        let mut had_problem = false;
        let mut outbox_error: Option<String> = None;
        let mut pruned_at = 0i64;
        loop {
            let problem = engine.health().store_problem;
            if let (Some(why), false) = (&problem, had_problem) {
                tokio::spawn(self.clone().store_problem(why.clone()));
            }
            had_problem = problem.is_some();
            let n = self.clone();
            let due = tokio::task::spawn_blocking(move || -> Result<Vec<crate::store::notify::Due>, StoreError> {
                let mut st = n.store();
                n.expand(&mut st)?;
                let now = crate::clock::now_ms();
                st.notify_due(now, NOTIFY_PARALLEL)
            })
            .await;
            let due = match due {
                Ok(Ok(d)) => {
                    outbox_error = None;
                    d
                }
                Ok(Err(e)) => {
                    // Said once per problem, not every half second (a full disk is reported by the engine too).
                    let msg = e.to_string();
                    if outbox_error.as_deref() != Some(&msg) {
                        warn!("notifications: cannot use the outbox: {msg}; new notifications wait until it can be written");
                        outbox_error = Some(msg);
                    }
                    vec![]
                }
                Err(e) => {
                    warn!("notifications: {e}");
                    vec![]
                }
            };
            // Targets in parallel; each target's notifications one after the other, oldest first,
            // so a channel reads "started" before "failed" (a retried one may still come later).
            let mut by_target: Vec<Vec<&crate::store::notify::Due>> = vec![];
            for d in &due {
                match by_target.iter_mut().find(|g| g[0].target == d.target) {
                    Some(g) => g.push(d),
                    None => by_target.push(vec![d]),
                }
            }
            for g in &mut by_target {
                g.sort_by_key(|d| d.id);
            }
            futures_util::future::join_all(by_target.into_iter().map(|g| {
                let (n, engine) = (self.clone(), engine.clone());
                async move {
                    for d in g {
                        let r = n.send(d).await;
                        n.record(&engine, d, r).await;
                    }
                }
            }))
            .await;
            let now = crate::clock::now_ms();
            if now - pruned_at > 3_600_000 {
                pruned_at = now;
                let n = self.clone();
                let keep = NOTIFY_KEEP.as_millis() as i64;
                // A delete that cannot be written is a database that cannot be written: the engine
                // stops starting work, as for its own retention (`Engine::prune_loop`).
                match tokio::task::spawn_blocking(move || n.store().notify_prune(now - keep)).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => engine.store_failed("pruning delivered notifications", &e),
                    Err(e) => warn!("pruning delivered notifications crashed: {e}"),
                }
            }
            if sent_all(&due) {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    _ = engine.stopped() => return,
                }
            }
        }
    }

    /// Send one delivery, within [`NOTIFY_SEND_TIMEOUT`].
    async fn send(&self, d: &crate::store::notify::Due) -> Result<(), String> {
        let work = async {
            match &d.target {
                NotifyTarget::Webhook { url } => {
                    let (u, addrs) = self.webhook_addresses(url).await?;
                    send::webhook(&u, &addrs, &d.payload, d.event).await
                }
                NotifyTarget::Email { address } => {
                    let smtp = self
                        .settings
                        .smtp
                        .as_ref()
                        .ok_or("the lab config no longer has an email relay (`[notify] smtp_host`)")?;
                    let p: NotifyPayload = serde_json::from_str(&d.payload)
                        .map_err(|e| format!("the stored notification is unreadable: {e}"))?;
                    send::email(smtp, self.login.as_ref(), address, &p).await
                }
            }
        };
        match tokio::time::timeout(NOTIFY_SEND_TIMEOUT, work).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "no answer within {}",
                crate::units::duration_setting(NOTIFY_SEND_TIMEOUT)
            )),
        }
    }

    /// Record how a send went, retrying the write until it succeeds (so a sent notification is never
    /// sent again by this engine; only a crash before the write can, see the module's note).
    async fn record(&self, engine: &Engine, d: &crate::store::notify::Due, r: Result<(), String>) {
        let tries = d.tries + 1;
        let next = match &r {
            Ok(()) => None,
            Err(_) if tries >= self.settings.max_tries => None,
            Err(_) => {
                let backoff = self.settings.retry_backoff.as_millis() as i64 * (1i64 << (tries - 1).min(20));
                Some(crate::clock::now_ms() + backoff.min(NOTIFY_BACKOFF_MAX.as_millis() as i64))
            }
        };
        let what = format!("{} to {}", d.event.as_str(), shown(d.target.address()));
        let id = (self.id_of())(d.event_id, d.sub_id);
        match &r {
            Ok(()) => info!(uid = d.uid, "notification {id} sent: {what}"),
            Err(e) if next.is_some() => warn!(
                uid = d.uid,
                "notification {id} ({what}) failed (try {tries} of {}): {e}; trying again", self.settings.max_tries
            ),
            Err(e) => error!(
                uid = d.uid,
                "notification {id} ({what}) given up after {tries} tries: {e}"
            ),
        }
        loop {
            let written = {
                let mut st = self.store();
                match &r {
                    Ok(()) => st.notify_delivered(d.id),
                    Err(e) => st.notify_failed(d.id, e, next),
                }
            };
            match written {
                Ok(()) => return,
                Err(e) => {
                    error!(
                        "notifications: cannot record that notification {id} was {}: {e}; trying again",
                        if r.is_ok() { "sent" } else { "not sent" }
                    );
                    tokio::select! {
                        _ = tokio::time::sleep(crate::defaults::STORE_RETRY) => {}
                        _ = engine.stopped() => return,
                    }
                }
            }
        }
    }

    /// The store cannot be written: tell the lab's webhooks that list `store_problem`, from memory.
    async fn store_problem(self: Arc<Self>, why: String) {
        let text = format!("Gantry on {} cannot write its state database: {why}", self.host);
        let at = crate::clock::now_ms();
        for (i, (url, _)) in self
            .settings
            .webhooks
            .iter()
            .enumerate()
            .filter(|(_, (_, on))| on.contains(&NotifyEvent::StoreProblem))
        {
            // Stable across this problem's retries (a receiver can drop a repeat).
            let id = format!("{}-store-{at}-{i}", self.db_uid);
            let p = NotifyPayload {
                schema: PAYLOAD_SCHEMA.into(),
                id,
                event: NotifyEvent::StoreProblem,
                at,
                host: self.host.clone(),
                job: None,
                text: text.clone(),
            };
            let body = serde_json::to_string(&p).unwrap_or_default();
            let mut wait = self.settings.retry_backoff;
            for attempt in 1..=self.settings.max_tries {
                let r = match self.webhook_addresses_lab(url).await {
                    Ok((u, addrs)) => tokio::time::timeout(
                        NOTIFY_SEND_TIMEOUT,
                        send::webhook(&u, &addrs, &body, NotifyEvent::StoreProblem),
                    )
                    .await
                    .unwrap_or_else(|_| Err("no answer".into())),
                    Err(e) => Err(e),
                };
                match r {
                    Ok(()) => {
                        info!("store problem reported to the lab's webhook {}", shown(url));
                        break;
                    }
                    Err(e) => warn!(
                        "reporting the store problem to {} failed (try {attempt}): {e}",
                        shown(url)
                    ),
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(NOTIFY_BACKOFF_MAX);
            }
        }
    }

    /// The lab's own webhooks go where the lab config says (its admin chose them).
    async fn webhook_addresses_lab(&self, url: &str) -> Result<(check::HookUrl, Vec<std::net::SocketAddr>), String> {
        let u = check::url_syntax(url)?;
        let addrs: Vec<_> = tokio::net::lookup_host((u.host.as_str(), u.port))
            .await
            .map_err(|e| format!("cannot resolve {}: {e}", u.host))?
            .collect();
        Ok((u, addrs))
    }
}

/// Whether `ip` is an address of this machine (any interface's: docker0, the LAN's): a socket
/// binds to it only then (for loopback, every 127.x address).
fn is_this_machine(ip: std::net::IpAddr) -> bool {
    std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// A user-given address in the engine's log: quoted and escaped (no forged lines).
fn shown(s: &str) -> String {
    format!("{s:?}")
}

/// A batch smaller than the most in flight: nothing else is due right now.
fn sent_all(due: &[crate::store::notify::Due]) -> bool {
    due.len() < NOTIFY_PARALLEL
}

/// The state a job event stands for.
fn state_of(kind: NotifyEvent) -> Option<&'static str> {
    Some(match kind {
        NotifyEvent::Started => "running",
        NotifyEvent::Finished => "succeeded",
        NotifyEvent::Failed => "failed",
        NotifyEvent::TimedOut => "timed_out",
        NotifyEvent::Cancelled => "cancelled",
        NotifyEvent::Preempted => "queued",
        _ => return None,
    })
}

/// The one line people read (Slack's and Mattermost's `text`, the email's subject and first line).
pub fn text_of(kind: NotifyEvent, job: Option<&NotifyJob>, detail: Option<&str>, host: &str) -> String {
    let j = |j: &NotifyJob| format!("job {} ({}) of {}", j.id, check::shown_name(&j.name), j.owner);
    let why = detail
        .map(|d| format!(": {}", d.lines().next().unwrap_or("")))
        .unwrap_or_default();
    match (kind, job) {
        (NotifyEvent::Started, Some(x)) => format!("{} started on {host}", j(x)),
        (NotifyEvent::Finished, Some(x)) => format!("{} finished on {host}", j(x)),
        (NotifyEvent::Failed, Some(x)) => match x.exit_code {
            Some(c) => format!("{} failed on {host} (exit code {c}){why}", j(x)),
            None => format!("{} failed on {host}{why}", j(x)),
        },
        (NotifyEvent::TimedOut, Some(x)) => format!("{} timed out on {host} and was stopped", j(x)),
        (NotifyEvent::Cancelled, Some(x)) => format!("{} was cancelled on {host}", j(x)),
        (NotifyEvent::Preempted, Some(x)) => format!("{} was preempted on {host} and is queued again{why}", j(x)),
        (NotifyEvent::SessionIdle, _) => format!("your session on {host} is idle and will be stopped soon{why}"),
        (NotifyEvent::BookingStarting, _) => format!("your GPU booking on {host} starts soon{why}"),
        (NotifyEvent::BookingReleased, _) => format!("your GPU booking on {host} was released{why}"),
        (NotifyEvent::StoreProblem, _) => format!("Gantry on {host} cannot write its state database{why}"),
        (NotifyEvent::Test, _) => format!(
            "test notification from Gantry on {host}{}",
            detail.map(|u| format!(" for {u}")).unwrap_or_default()
        ),
        (k, None) => format!("{} on {host}{why}", k.as_str()),
    }
}

/// `USER:PASSWORD` on the first line of a file only the engine's user may read.
fn read_login(path: &std::path::Path) -> Result<Login, String> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(path).map_err(|e| {
        format!(
            "cannot read the SMTP credentials file {} (`[notify] smtp_credentials`): {e}",
            path.display()
        )
    })?;
    let me = nix::unistd::geteuid().as_raw();
    if md.uid() != me || md.mode() & 0o077 != 0 {
        return Err(format!(
            "the SMTP credentials file {} (`[notify] smtp_credentials`) is owned by uid {} with mode {:o}: it must be owned by uid {me} (the engine's user) and readable by it alone; run `chown {me} {0}; chmod 600 {0}`",
            path.display(),
            md.uid(),
            md.mode() & 0o777
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let line = text.lines().next().unwrap_or("").trim();
    let (user, password) = line
        .split_once(':')
        .ok_or_else(|| format!("{}: the first line is not USER:PASSWORD", path.display()))?;
    Ok(Login {
        user: user.to_string(),
        password: password.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_event_has_a_line_people_can_read() {
        let job = NotifyJob {
            id: 7,
            name: "train".into(),
            owner: "ada".into(),
            state: "failed".into(),
            exit_code: Some(3),
            message: None,
        };
        assert_eq!(
            text_of(NotifyEvent::Failed, Some(&job), Some("exited with code 3\nmore"), "box"),
            "job 7 (train) of ada failed on box (exit code 3): exited with code 3"
        );
        assert_eq!(
            text_of(NotifyEvent::Finished, Some(&job), None, "box"),
            "job 7 (train) of ada finished on box"
        );
        assert_eq!(
            text_of(NotifyEvent::Test, None, Some("ada"), "box"),
            "test notification from Gantry on box for ada"
        );
        // A job's name cannot pose as the lab's notice: no line breaks or control characters, bounded.
        let sly = NotifyJob {
            name: "x)\r\nSubject: ACTION REQUIRED: your lab account expires today, log in at https://evil.example/ now\u{202e}".into(),
            ..job.clone()
        };
        let t = text_of(NotifyEvent::Finished, Some(&sly), None, "box");
        assert_eq!(
            t,
            "job 7 (x) Subject: ACTION REQUIRED: your lab...) of ada finished on box"
        );
        for k in NotifyEvent::ALL {
            assert!(!text_of(k, Some(&job), None, "box").is_empty());
            assert_eq!(NotifyEvent::parse(k.as_str()), Some(k));
        }
    }

    #[test]
    fn smtp_credentials_must_be_the_engines_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("creds");
        std::fs::write(&p, "relay-user:s3:cret\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = read_login(&p).err().unwrap();
        assert!(e.contains("mode 640") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let l = read_login(&p).unwrap();
        assert_eq!((l.user.as_str(), l.password.as_str()), ("relay-user", "s3:cret"));
    }
}
