//! The Docker executor: [`Executor`] over bollard — images, a container's create, start, wait,
//! stop and removal, finding containers again, GPUs held by others, logs, terminals and ports.

use std::collections::HashMap;
use std::time::Duration;

use bollard::errors::Error as DockerError;
use bollard::models::{ContainerCreateBody, DeviceRequest, HostConfig, Mount, MountType};
use bollard::query_parameters as qp;
use bollard::Docker;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;

use super::{
    classify, command_argv, container_host_config, gpus_of, job_env, settle, unreachable_or_forbidden, ExecError,
    Executor, Exit, ForeignGpuUse, Found, Frame, GpuBinding, GpuSet, HostRoot, Launch, Life, NetworkLock, Settled,
    Storage, Terminal, CLAIM_WAIT, CLAIM_WINDOW, LABEL_ATTEMPT, LABEL_CPUS, LABEL_DB, LABEL_ENGINE, LABEL_GPUS,
    LABEL_GPU_UUIDS, LABEL_JOB, LABEL_PROBE, LABEL_UID,
};

/// Files read from images, by image id and paths (images do not change; a few dozen are in use).
type ImageFiles = std::sync::Arc<std::sync::Mutex<HashMap<(String, Vec<String>), Vec<Option<Vec<u8>>>>>>;

#[derive(Clone)]
pub struct DockerExecutor {
    pub(super) docker: Docker,
    /// Container id -> its GPUs (a container's configuration never changes): one inspect per container.
    inspected: std::sync::Arc<std::sync::Mutex<HashMap<String, Option<GpuSet>>>>,
    image_files: ImageFiles,
    /// Held while this engine makes or removes a user's network.
    pub(super) networks: std::sync::Arc<tokio::sync::Mutex<()>>,
}

/// The first plain file in a tar stream (as Docker's archive API sends one path), skipping extended
/// headers; `None` for anything else (a link, a directory) or a broken archive.
pub(super) fn first_plain_file(tar: &[u8]) -> Option<Vec<u8>> {
    let mut at = 0;
    for _ in 0..4 {
        let h = tar.get(at..at + 512)?;
        let size_field = std::str::from_utf8(&h[124..136])
            .ok()?
            .trim_matches(|c: char| c == '\0' || c == ' ');
        let size = usize::from_str_radix(size_field, 8).ok()?;
        let data = at + 512;
        match h[156] {
            b'0' | 0 => return tar.get(data..data + size).map(<[u8]>::to_vec),
            b'x' | b'g' => at = data + size.div_ceil(512) * 512,
            _ => return None,
        }
    }
    None
}

impl DockerExecutor {
    /// The GPUs a listed container holds: from Gantry's label, else from its configuration (inspected
    /// once per container; a container's configuration never changes).
    async fn gpus_of_listed(&self, c: &bollard::models::ContainerSummary) -> Option<GpuSet> {
        let id = c.id.clone()?;
        if let Some(u) = c.labels.as_ref().and_then(|l| l.get(LABEL_GPU_UUIDS)) {
            return (!u.is_empty()).then(|| GpuSet::Ids(u.split(',').map(String::from).collect()));
        }
        if let Some(g) = self.inspected.lock().unwrap().get(&id).cloned() {
            return g;
        }
        let info = self
            .docker
            .inspect_container(&id, None::<qp::InspectContainerOptions>)
            .await
            .ok()?;
        let hc = info.host_config.unwrap_or_default();
        let env = info.config.and_then(|c| c.env).unwrap_or_default();
        let g = gpus_of(&hc.device_requests.unwrap_or_default(), hc.runtime.as_deref(), &env);
        self.inspected.lock().unwrap().insert(id, g.clone());
        g
    }

    pub fn connect() -> Result<DockerExecutor, ExecError> {
        let docker = Docker::connect_with_local_defaults().map_err(|e| ExecError::DockerUnavailable(e.to_string()))?;
        Ok(DockerExecutor {
            docker,
            inspected: Default::default(),
            image_files: Default::default(),
            networks: Default::default(),
        })
    }
}

#[async_trait::async_trait]
impl Executor for DockerExecutor {
    async fn ping(&self) -> Result<(), ExecError> {
        self.docker.ping().await.map(|_| ()).map_err(unreachable_or_forbidden)
    }

    async fn has_image(&self, image: &str) -> Result<bool, ExecError> {
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(true),
            Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => Ok(false),
            Err(e) => Err(classify(e)),
        }
    }

    async fn pull(&self, image: &str) -> Result<(), ExecError> {
        let opts = qp::CreateImageOptions {
            from_image: Some(image.to_string()),
            ..Default::default()
        };
        let mut stream = self.docker.create_image(Some(opts), None, None);
        while let Some(item) = stream.next().await {
            if let Err(e) = item {
                let detail = match e {
                    DockerError::DockerResponseServerError { message, .. } => message,
                    DockerError::DockerStreamError { error } => error,
                    other => other.to_string(),
                };
                return Err(ExecError::ImageUnavailable {
                    image: image.into(),
                    detail,
                });
            }
        }
        match self.has_image(image).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(ExecError::ImageUnavailable {
                image: image.into(),
                detail: "Docker finished the pull without the image".into(),
            }),
            Err(e) => Err(e),
        }
    }

    async fn create(&self, l: &Launch<'_>) -> Result<String, ExecError> {
        let labels = HashMap::from([
            (LABEL_ENGINE.to_string(), l.engine_id.to_string()),
            (LABEL_JOB.to_string(), l.job_id.to_string()),
            (LABEL_ATTEMPT.to_string(), l.attempt_id.to_string()),
            (LABEL_DB.to_string(), l.db_uid.to_string()),
            (
                LABEL_GPUS.to_string(),
                l.gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(","),
            ),
            (LABEL_GPU_UUIDS.to_string(), l.gpu_uuids.join(",")),
        ]);
        let mut labels = labels;
        labels.insert(LABEL_UID.to_string(), l.uid.to_string());
        if let Some(c) = &l.container.cpuset {
            labels.insert(LABEL_CPUS.to_string(), c.clone());
        }
        // `Mounts`, not `Binds`: Docker refuses a missing source instead of creating it as root. The source
        // is what the owner's check opened, pinned by a root engine under its state dir (`staging`), so no
        // swap after the check can redirect it; a non-root engine passes the resolved path (Docker 20.10's
        // runc cannot bind /proc/<pid>/fd/<n> itself).
        let mounts: Vec<Mount> = l
            .mounts
            .iter()
            .map(|m| Mount {
                typ: Some(MountType::BIND),
                source: Some(m.host.to_string_lossy().into_owned()),
                target: Some(m.container.clone()),
                read_only: Some(m.read_only),
                ..Default::default()
            })
            .collect();
        let groups: Vec<String> = l
            .groups
            .iter()
            .filter(|g| **g != l.gid)
            .map(|g| g.to_string())
            .collect();
        let device_requests = (l.binding == GpuBinding::Nvidia && !l.gpu_uuids.is_empty()).then(|| {
            vec![DeviceRequest {
                driver: Some("nvidia".into()),
                device_ids: Some(l.gpu_uuids.clone()),
                capabilities: Some(vec![vec!["gpu".into()]]),
                ..Default::default()
            }]
        });
        let tty = l.job.spec.interactive;
        let body = ContainerCreateBody {
            image: Some(l.image.clone().unwrap_or_else(|| l.job.spec.image.clone())),
            cmd: l.command.clone().or_else(|| {
                l.job
                    .spec
                    .command
                    .as_ref()
                    .map(|c| command_argv(c, l.start_gate.as_deref()))
            }),
            // A session's shell gets a terminal, and its stdin stays open between attachments.
            tty: tty.then_some(true),
            open_stdin: tty.then_some(true),
            stdin_once: tty.then_some(false),
            env: Some(job_env(l)),
            working_dir: l.job.spec.workdir.clone(),
            user: Some(format!("{}:{}", l.uid, l.gid)),
            labels: Some(labels),
            host_config: Some(HostConfig {
                mounts: (!mounts.is_empty()).then_some(mounts),
                group_add: (!groups.is_empty()).then_some(groups),
                security_opt: Some(vec!["no-new-privileges".into()]),
                cap_drop: Some(vec!["ALL".into()]),
                init: Some(true),
                device_requests,
                ..container_host_config(l)
            }),
            ..Default::default()
        };
        let opts = qp::CreateContainerOptions {
            name: Some(l.name.clone()),
            ..Default::default()
        };
        // On the owner's own network. This engine never removes it between ensure and create (the
        // lock); another engine may, when its last container goes (see `remove`): then once more.
        let mut body = body;
        // Two engines making it at the same moment leave two of that name for a moment (Docker then
        // calls the name ambiguous): the extra one goes (see `ensure_network`), so try again shortly.
        let _one = self.networks.lock().await;
        let _all = NetworkLock::take().await;
        let mut tries = 0;
        loop {
            tries += 1;
            let net = self.ensure_network(l.uid).await?;
            body.host_config.as_mut().unwrap().network_mode = Some(net);
            match self.docker.create_container(Some(opts.clone()), body.clone()).await {
                Ok(c) => return Ok(c.id),
                Err(DockerError::DockerResponseServerError { status_code, message })
                    if (status_code == 404 || message.contains("ambiguous")) && message.contains("network") =>
                {
                    if tries >= 20 {
                        return Err(ExecError::NetworkGone(message));
                    }
                    tracing::debug!("network of uid {} changed before create ({message}); again", l.uid);
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(classify(e)),
            }
        }
    }

    async fn storage(&self) -> Result<Option<Storage>, ExecError> {
        let info = self.docker.info().await.map_err(unreachable_or_forbidden)?;
        let backing = info
            .driver_status
            .unwrap_or_default()
            .into_iter()
            .find(|kv| kv.first().is_some_and(|k| k == "Backing Filesystem"))
            .and_then(|kv| kv.get(1).cloned());
        Ok(Some(Storage {
            root_dir: info.docker_root_dir.unwrap_or_else(|| "/var/lib/docker".into()),
            driver: info.driver.unwrap_or_default(),
            backing,
        }))
    }

    async fn writers(&self) -> Result<Vec<crate::policy::Writer>, ExecError> {
        let filters = HashMap::from([("label".to_string(), vec![LABEL_JOB.to_string()])]);
        let opts = qp::ListContainersOptions {
            all: true,
            size: true,
            filters: Some(filters),
            ..Default::default()
        };
        let list = self.docker.list_containers(Some(opts)).await.map_err(classify)?;
        Ok(list
            .into_iter()
            .map(|c| {
                let labels = c.labels.unwrap_or_default();
                let uid = labels.get(LABEL_UID).and_then(|u| u.parse::<u32>().ok());
                let owner = match uid {
                    Some(u) => nix::unistd::User::from_uid(u.into())
                        .ok()
                        .flatten()
                        .map(|p| p.name)
                        .unwrap_or_else(|| format!("uid {u}")),
                    None => "owner unknown".into(),
                };
                crate::policy::Writer {
                    job_id: labels.get(LABEL_JOB).and_then(|j| j.parse().ok()),
                    owner,
                    size_rw: c.size_rw.unwrap_or(0).max(0) as u64,
                }
            })
            .collect())
    }

    async fn pinned_cpus(&self) -> Result<Vec<u32>, ExecError> {
        let filters = HashMap::from([
            ("label".to_string(), vec![LABEL_CPUS.to_string()]),
            (
                "status".to_string(),
                vec![
                    "created".to_string(),
                    "running".to_string(),
                    "restarting".to_string(),
                    "paused".to_string(),
                ],
            ),
        ]);
        let opts = qp::ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        };
        let list = self.docker.list_containers(Some(opts)).await.map_err(classify)?;
        Ok(list
            .iter()
            .filter_map(|c| c.labels.as_ref()?.get(LABEL_CPUS))
            .flat_map(|l| crate::resources::parse_cpu_list(l))
            .collect())
    }

    async fn image_files(&self, image: &str, paths: &[&str], max: usize) -> Result<Vec<Option<Vec<u8>>>, ExecError> {
        let id = self
            .docker
            .inspect_image(image)
            .await
            .map_err(classify)?
            .id
            .unwrap_or_else(|| image.to_string());
        let key = (id, paths.iter().map(|p| p.to_string()).collect::<Vec<_>>());
        if let Some(hit) = self.image_files.lock().unwrap().get(&key) {
            return Ok(hit.clone());
        }
        let body = ContainerCreateBody {
            image: Some(image.to_string()),
            cmd: Some(vec!["true".into()]),
            network_disabled: Some(true),
            labels: Some(HashMap::from([(LABEL_PROBE.to_string(), "1".to_string())])),
            ..Default::default()
        };
        let probe = self
            .docker
            .create_container(None::<qp::CreateContainerOptions>, body)
            .await
            .map_err(classify)?
            .id;
        let mut out = vec![];
        for p in paths {
            let mut s = self
                .docker
                .download_from_container(&probe, Some(qp::DownloadFromContainerOptions { path: p.to_string() }));
            let mut tar = vec![];
            let mut ok = true;
            while let Some(chunk) = s.next().await {
                match chunk {
                    Ok(c) if tar.len() + c.len() <= max + 4096 => tar.extend_from_slice(&c),
                    _ => {
                        ok = false;
                        break;
                    }
                }
            }
            out.push(ok.then(|| first_plain_file(&tar)).flatten().filter(|f| f.len() <= max));
        }
        let opts = qp::RemoveContainerOptions {
            force: true,
            v: true,
            ..Default::default()
        };
        if let Err(e) = self.docker.remove_container(&probe, Some(opts)).await {
            tracing::warn!("could not remove the container {probe} made to read {image}'s files: {e}");
        }
        let mut cache = self.image_files.lock().unwrap();
        if cache.len() >= 64 {
            cache.clear();
        }
        cache.insert(key, out.clone());
        Ok(out)
    }

    async fn start(&self, id: &str) -> Result<(), ExecError> {
        match self.docker.start_container(id, None::<qp::StartContainerOptions>).await {
            // Another engine removed the user's network between our create and start (its last
            // container went at that moment): the next try makes it again.
            Err(DockerError::DockerResponseServerError { status_code, message })
                if message.contains("network") && (status_code == 404 || message.contains("ambiguous")) =>
            {
                Err(ExecError::NetworkGone(message))
            }
            r => r.map_err(classify),
        }
    }

    async fn wait(&self, id: &str) -> Result<Exit, ExecError> {
        let mut s = self.docker.wait_container(id, None::<qp::WaitContainerOptions>);
        match s.next().await {
            Some(Ok(_)) | Some(Err(DockerError::DockerContainerWaitError { .. })) | None => {}
            Some(Err(e)) => return Err(classify(e)),
        }
        self.exit_of(id)
            .await?
            .ok_or_else(|| ExecError::Rejected(format!("container {id} still running after wait")))
    }

    async fn exit_of(&self, id: &str) -> Result<Option<Exit>, ExecError> {
        let info = self
            .docker
            .inspect_container(id, None::<qp::InspectContainerOptions>)
            .await
            .map_err(classify)?;
        let st = info.state.unwrap_or_default();
        if st.running.unwrap_or(false) {
            return Ok(None);
        }
        Ok(Some(Exit {
            code: st.exit_code.unwrap_or(-1),
            oom_killed: st.oom_killed.unwrap_or(false),
        }))
    }

    async fn stop(&self, id: &str, grace: Duration) -> Result<(), ExecError> {
        let opts = qp::StopContainerOptions {
            t: Some(grace.as_secs() as i32),
            signal: None,
        };
        match self.docker.stop_container(id, Some(opts)).await {
            Ok(()) | Err(DockerError::DockerResponseServerError { status_code: 304, .. }) => Ok(()),
            Err(e) => Err(classify(e)),
        }
    }

    async fn stop_signal(&self, id: &str, signal: &str, grace: Duration) -> Result<(), ExecError> {
        // The signal is sent with `kill`, not as `stop`'s `signal`: Docker before API 1.42 (Debian 12's
        // 20.10 speaks 1.41) ignores that parameter and sends SIGTERM, which kills a job that saves
        // its checkpoint on SIGUSR1. Then the grace, then `stop` (SIGTERM, SIGKILL a second later).
        match self
            .docker
            .kill_container(
                id,
                Some(qp::KillContainerOptions {
                    signal: signal.to_string(),
                }),
            )
            .await
        {
            Ok(()) => {}
            // Not running (any more): nothing to stop.
            Err(DockerError::DockerResponseServerError {
                status_code: 304 | 409, ..
            }) => return Ok(()),
            Err(e) => return Err(classify(e)),
        }
        let mut exited = self.docker.wait_container(id, None::<qp::WaitContainerOptions>);
        if tokio::time::timeout(grace, exited.next()).await.is_ok() {
            return Ok(());
        }
        self.stop(id, Duration::from_secs(1)).await
    }

    async fn remove(&self, id: &str) -> Result<(), ExecError> {
        // Its user's network goes with the user's last container (bridge networks come from a small
        // address pool: about 30 on Docker's defaults).
        let network = match self
            .docker
            .inspect_container(id, None::<qp::InspectContainerOptions>)
            .await
        {
            Ok(c) => c
                .host_config
                .and_then(|h| h.network_mode)
                .filter(|n| n.starts_with("gantry-u") || n.len() == 64),
            Err(_) => None,
        };
        let opts = qp::RemoveContainerOptions {
            force: true,
            v: true,
            ..Default::default()
        };
        match self.docker.remove_container(id, Some(opts)).await {
            Ok(()) | Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => {}
            Err(e) => return Err(classify(e)),
        }
        if let Some(n) = network {
            self.remove_network_if_unused(&n).await;
        }
        Ok(())
    }

    async fn list_ours(&self, engine_id: &str) -> Result<Vec<Found>, ExecError> {
        let filters = HashMap::from([("label".to_string(), vec![format!("{LABEL_ENGINE}={engine_id}")])]);
        let opts = qp::ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        };
        let list = self.docker.list_containers(Some(opts)).await.map_err(classify)?;
        Ok(list
            .into_iter()
            .filter_map(|c| {
                let labels = c.labels.unwrap_or_default();
                let state = c.state.map(|s| s.to_string()).unwrap_or_default();
                Some(Found {
                    container_id: c.id?,
                    name: c
                        .names
                        .unwrap_or_default()
                        .first()
                        .map(|n| n.trim_start_matches('/').to_string())
                        .unwrap_or_default(),
                    job_id: labels.get(LABEL_JOB)?.parse().ok()?,
                    attempt_id: labels.get(LABEL_ATTEMPT)?.parse().ok()?,
                    db_uid: labels.get(LABEL_DB).cloned(),
                    gpus: labels
                        .get(LABEL_GPUS)
                        .map(|g| g.split(',').filter_map(|x| x.parse().ok()).collect())
                        .unwrap_or_default(),
                    life: match state.as_str() {
                        "running" | "restarting" | "paused" => Life::Running,
                        "created" => Life::Unsettled,
                        _ => Life::Exited,
                    },
                })
            })
            .collect())
    }

    async fn settle(&self, id: &str) -> Result<Option<Settled>, ExecError> {
        settle::settle(self, id).await
    }

    async fn foreign_gpu_users(&self, engine_id: &str) -> Result<Vec<ForeignGpuUse>, ExecError> {
        let list = self
            .docker
            .list_containers(Some(qp::ListContainersOptions {
                all: false,
                ..Default::default()
            }))
            .await
            .map_err(classify)?;
        let mut out = vec![];
        let mut seen = vec![];
        for c in list {
            let Some(id) = c.id.clone() else { continue };
            if c.labels
                .as_ref()
                .and_then(|l| l.get(LABEL_ENGINE))
                .is_some_and(|e| e == engine_id)
            {
                continue;
            }
            seen.push(id.clone());
            if let Some(gpus) = self.gpus_of_listed(&c).await {
                out.push(ForeignGpuUse {
                    container_id: id,
                    name: listed_name(&c),
                    gpus,
                });
            }
        }
        self.inspected.lock().unwrap().retain(|k, _| seen.contains(k));
        Ok(out)
    }

    async fn gpu_taken(
        &self,
        id: &str,
        engine_id: &str,
        gpus: &[(Option<u32>, String)],
    ) -> Result<Option<String>, ExecError> {
        if gpus.is_empty() {
            return Ok(None);
        }
        let began = std::time::Instant::now();
        loop {
            let filters = HashMap::from([(
                "status".to_string(),
                vec!["created".to_string(), "running".to_string(), "restarting".to_string()],
            )]);
            let opts = qp::ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            };
            let list = self.docker.list_containers(Some(opts)).await.map_err(classify)?;
            let now_s = now_ns() / 1_000_000_000;
            let mut later: Option<String> = None;
            for c in list {
                let Some(cid) = c.id.clone() else { continue };
                if cid == id
                    || c.labels
                        .as_ref()
                        .and_then(|l| l.get(LABEL_ENGINE))
                        .is_some_and(|e| e == engine_id)
                {
                    continue;
                }
                let Some(theirs) = self.gpus_of_listed(&c).await else {
                    continue;
                };
                if !gpus.iter().any(|(i, u)| theirs.holds_claim(*i, u)) {
                    continue;
                }
                let created_only = c
                    .state
                    .as_ref()
                    .is_some_and(|s| matches!(s, bollard::models::ContainerSummaryStateEnum::CREATED));
                if !created_only {
                    return Ok(Some(listed_name(&c))); // it runs: it was first
                }
                if now_s - c.created.unwrap_or(0) as i128 > CLAIM_WINDOW.as_secs() as i128 {
                    continue; // created long ago and never started: not a placement in flight
                }
                // Both only created. Whichever engine checks second sees the other's container (each
                // checks after its own create), so a fixed order between the two ids decides: the
                // larger id gives way; the smaller waits until the larger is gone (it gave way) or runs
                // (it never saw ours).
                if cid.as_str() < id {
                    return Ok(Some(listed_name(&c)));
                }
                later = Some(listed_name(&c));
            }
            match later {
                None => return Ok(None),
                Some(name) if began.elapsed() > CLAIM_WAIT => return Ok(Some(name)),
                Some(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    fn logs(&self, id: &str, since_s: i64, follow: bool) -> BoxStream<'static, Result<Frame, ExecError>> {
        let opts = qp::LogsOptions {
            follow,
            stdout: true,
            stderr: true,
            timestamps: true,
            since: since_s as i32,
            ..Default::default()
        };
        self.docker
            .logs(id, Some(opts))
            .map(|r| r.map(Frame::of).map_err(classify))
            .boxed()
    }

    async fn terminal(&self, id: &str) -> Result<Terminal, ExecError> {
        // Docker's own detach keys stay its default (Ctrl-P Ctrl-Q), the ones the CLI detaches on itself.
        let opts = qp::AttachContainerOptions {
            stream: true,
            stdin: true,
            stdout: true,
            stderr: true,
            ..Default::default()
        };
        let a = self.docker.attach_container(id, Some(opts)).await.map_err(classify)?;
        Ok(Terminal {
            output: a.output.map(|o| o.map(|o| Frame::of(o).data).map_err(classify)).boxed(),
            input: a.input,
        })
    }

    async fn ensure_host_root(&self, root: &HostRoot) -> Result<String, ExecError> {
        match self.docker.inspect_image(&root.tag).await {
            Ok(_) => return Ok(root.tag.clone()),
            Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => {}
            Err(e) => return Err(classify(e)),
        }
        let (repo, tag) = root.tag.split_once(':').unwrap_or((&root.tag, "latest"));
        let opts = qp::CreateImageOptions {
            from_src: Some("-".into()),
            repo: Some(repo.into()),
            tag: Some(tag.into()),
            ..Default::default()
        };
        let mut stream = self.docker.create_image(
            Some(opts),
            Some(bollard::body_full(Bytes::from(root.tar.clone()))),
            None,
        );
        while let Some(item) = stream.next().await {
            item.map_err(|e| ExecError::ImageUnavailable {
                image: root.tag.clone(),
                detail: e.to_string(),
            })?;
        }
        tracing::info!("made {}, the root of jobs in this machine's own folders", root.tag);
        Ok(root.tag.clone())
    }

    async fn connect_port(&self, id: &str, port: u16) -> Result<tokio::net::TcpStream, ExecError> {
        let info = self
            .docker
            .inspect_container(id, None::<qp::InspectContainerOptions>)
            .await
            .map_err(classify)?;
        let pid = info
            .state
            .as_ref()
            .and_then(|s| s.pid)
            .filter(|p| *p > 0)
            .ok_or_else(|| ExecError::Rejected(format!("container {id} is not running")))?;
        let inside = tokio::task::spawn_blocking(move || connect_in_netns(pid as u32, port))
            .await
            .map_err(|e| ExecError::Rejected(e.to_string()))?;
        let stream = match inside {
            Ok(s) => s,
            // Not root (a user's own engine): the container's address on its Docker network.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) => {
                let ip = info
                    .network_settings
                    .and_then(|n| n.networks)
                    .and_then(|n| n.into_values().find_map(|v| v.ip_address.filter(|a| !a.is_empty())));
                let ip = ip.ok_or_else(|| {
                    ExecError::Rejected(format!("container {id} has no address to reach port {port} at"))
                })?;
                std::net::TcpStream::connect((ip.as_str(), port))
                    .map_err(|e| ExecError::Rejected(format!("port {port} of the job: {e}")))?
            }
            Err(e) => {
                return Err(ExecError::Rejected(format!(
                    "port {port} of the job: {e}; is its server listening on 127.0.0.1:{port} inside?"
                )))
            }
        };
        stream
            .set_nonblocking(true)
            .map_err(|e| ExecError::Rejected(e.to_string()))?;
        tokio::net::TcpStream::from_std(stream).map_err(|e| ExecError::Rejected(e.to_string()))
    }

    async fn listen_in(&self, id: &str, port: u16) -> Result<std::net::TcpListener, ExecError> {
        let pid_of = |info: &bollard::models::ContainerInspectResponse| {
            info.state
                .as_ref()
                .filter(|s| s.running == Some(true))
                .and_then(|s| s.pid)
                .filter(|p| *p > 0)
        };
        let inspect = || self.docker.inspect_container(id, None::<qp::InspectContainerOptions>);
        let pid = pid_of(&inspect().await.map_err(classify)?)
            .ok_or_else(|| ExecError::NotFound(format!("container {id} is not running")))?;
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))
            .map_err(|_| ExecError::NotFound(format!("container {id} ended")))?;
        // Still running with that pid: the namespace opened is the container's, not that of a
        // process that took the pid of one that ended.
        if pid_of(&inspect().await.map_err(classify)?) != Some(pid) {
            return Err(ExecError::NotFound(format!("container {id} ended")));
        }
        tokio::task::spawn_blocking(move || listen_in_netns(ns, port))
            .await
            .map_err(|e| ExecError::Rejected(e.to_string()))?
            .map_err(|e| ExecError::Rejected(format!("listening on 127.0.0.1:{port} inside the job: {e}")))
    }

    async fn env_of(&self, id: &str) -> Result<Vec<String>, ExecError> {
        let info = self
            .docker
            .inspect_container(id, None::<qp::InspectContainerOptions>)
            .await
            .map_err(classify)?;
        Ok(info.config.and_then(|c| c.env).unwrap_or_default())
    }

    async fn resize(&self, id: &str, cols: u16, rows: u16) -> Result<(), ExecError> {
        let opts = qp::ResizeContainerTTYOptions {
            w: cols.max(1) as i32,
            h: rows.max(1) as i32,
        };
        self.docker.resize_container_tty(id, opts).await.map_err(classify)
    }

    async fn attach(&self, id: &str) -> BoxStream<'static, Result<Frame, ExecError>> {
        let opts = qp::AttachContainerOptions {
            stream: true,
            stdout: true,
            stderr: true,
            ..Default::default()
        };
        match self.docker.attach_container(id, Some(opts)).await {
            // The input half is kept with the output: dropping it could end the attachment.
            Ok(a) => {
                let input = a.input;
                a.output
                    .map(move |o| {
                        let _ = &input;
                        o.map(Frame::of).map_err(classify)
                    })
                    .boxed()
            }
            Err(e) => futures_util::stream::once(async move { Err(classify(e)) }).boxed(),
        }
    }
}

/// Connect to 127.0.0.1:`port` in the network namespace of process `pid`, from a thread made for
/// it (a thread's namespace is its own; the socket keeps the namespace it was made in, and the
/// thread ends there).
fn connect_in_netns(pid: u32, port: u16) -> std::io::Result<std::net::TcpStream> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    std::thread::spawn(move || {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
        std::net::TcpStream::connect_timeout(
            &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            Duration::from_secs(10),
        )
    })
    .join()
    .map_err(|_| std::io::Error::other("the connecting thread panicked"))?
}

/// Listen on 127.0.0.1:`port` in the network namespace `ns`, from a thread made for it (as
/// [`connect_in_netns`]). Never in the engine's own namespace: that one every local user reaches.
fn listen_in_netns(ns: std::fs::File, port: u16) -> std::io::Result<std::net::TcpListener> {
    use std::os::unix::fs::MetadataExt;
    let own = std::fs::metadata("/proc/thread-self/ns/net")?;
    let theirs = ns.metadata()?;
    if (own.dev(), own.ino()) == (theirs.dev(), theirs.ino()) {
        return Err(std::io::Error::other("the container shares the engine's network"));
    }
    std::thread::spawn(move || {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
        std::net::TcpListener::bind(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
    })
    .join()
    .map_err(|_| std::io::Error::other("the listening thread panicked"))?
}

fn listed_name(c: &bollard::models::ContainerSummary) -> String {
    c.names
        .as_ref()
        .and_then(|n| n.first())
        .map(|n| n.trim_start_matches('/').to_string())
        .unwrap_or_default()
}

fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}
