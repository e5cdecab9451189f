//! Host paths checked as the submitter.
//!
//! The engine runs as root, so it may not judge a user's mount by what it can open itself. A short-lived
//! helper process takes the submitter's uid, gid and supplementary groups and opens the path with
//! `O_PATH`: the kernel then checks search permission on every component and follows symlinks as that
//! user, with every permission rule it knows (ACLs, LSMs, root-squashing NFS). The helper reports the
//! resolved path, its type, device and inode, and whether the user may read (and write) it, and hands
//! the opened file itself back to the engine (SCM_RIGHTS). A root engine mounts exactly that file (see
//! [`crate::staging`]), so swapping a path component afterwards changes nothing; any other engine mounts
//! the resolved path, never the one written in the spec.
//!
//! The engine is multi-threaded, so the forked helper only makes raw, async-signal-safe calls: every
//! buffer is prepared before `fork`, and the helper never allocates.

use std::ffi::{CStr, CString};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::spec::{Mount, SpecError};

/// How long one path check may take (a path on a hung network file system must not hang the engine).
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// Whose permissions a check uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (including `gid`).
    pub groups: Vec<u32>,
    /// For messages: the login name, or the uid when it has none.
    pub name: String,
}

impl Cred {
    /// The user's credentials as a login would set them: supplementary groups from the group database.
    pub fn of_user(uid: u32, gid: u32) -> Cred {
        use nix::unistd::{getgrouplist, Gid, Uid, User};
        let user = User::from_uid(Uid::from_raw(uid)).ok().flatten();
        let groups = user
            .as_ref()
            .and_then(|u| CString::new(u.name.as_str()).ok())
            .and_then(|n| getgrouplist(&n, Gid::from_raw(gid)).ok())
            .map(|g| g.into_iter().map(Gid::as_raw).collect())
            .unwrap_or_else(|| vec![gid]);
        Cred { uid, gid, groups, name: user.map(|u| u.name).unwrap_or_else(|| uid.to_string()) }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Directory,
    File,
    /// Socket, device, fifo: never mounted.
    Other(&'static str),
}

/// A path as the user's own open resolved it.
#[derive(Debug)]
pub struct Resolved {
    /// Absolute, every symlink followed.
    pub path: PathBuf,
    pub kind: FileKind,
    pub dev: u64,
    pub ino: u64,
    /// The file the user's open reached (`O_PATH`).
    pub file: OwnedFd,
}

#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("{} does not exist", path.display())]
    Missing { path: PathBuf },
    /// The user cannot get to the path: `blocked` says where (a directory without search permission or a
    /// symlink leading somewhere they cannot go), when known.
    #[error("permission denied{}", blocked.as_ref().map(|b| format!(" {b}")).unwrap_or_default())]
    Unreachable { path: PathBuf, blocked: Option<String> },
    #[error("cannot read {}", path.display())]
    NoRead { path: PathBuf },
    #[error("cannot write {}{}", path.display(), if *read_only_fs { " (it is on a read-only file system)" } else { "" })]
    NoWrite { path: PathBuf, read_only_fs: bool },
    #[error("this engine runs as uid {engine_uid} and cannot check paths as uid {uid}")]
    CannotActAs { engine_uid: u32, uid: u32 },
    #[error("no answer within {}s (is it on a network file system that does not respond?)", CHECK_TIMEOUT.as_secs())]
    Timeout { path: PathBuf },
    #[error("{} changed while it was being checked", path.display())]
    Changed { path: PathBuf },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

impl AccessError {
    /// Where the path led, when the user got that far.
    fn resolved(&self) -> Option<&Path> {
        match self {
            AccessError::NoRead { path } | AccessError::NoWrite { path, .. } => Some(path),
            _ => None,
        }
    }
}

// ---- The helper ----

const PATH_CAP: usize = libc::PATH_MAX as usize;

const OK: u32 = 0;
const STAGE_CRED: u32 = 1;
const STAGE_OPEN: u32 = 2;
const STAGE_STAT: u32 = 3;
const STAGE_LINK: u32 = 4;
const STAGE_READ: u32 = 5;
const STAGE_WRITE: u32 = 6;
const STAGE_MKDIR: u32 = 7;

/// What the helper writes back through the pipe, as plain bytes.
#[repr(C)]
#[derive(Clone, Copy)]
struct Reply {
    stage: u32,
    errno: i32,
    mode: u32,
    /// Length of the first prefix of the path the user could not open (EACCES); 0 when unknown.
    denied_at: u32,
    dev: u64,
    ino: u64,
    len: u32,
    _pad: u32,
    path: [u8; PATH_CAP],
}

fn errno() -> i32 {
    // SAFETY: reads the calling thread's errno; async-signal-safe.
    unsafe { *libc::__errno_location() }
}

/// `/proc/self/fd/<fd>` into `buf`, NUL-terminated, without allocating.
fn fd_link(fd: i32, buf: &mut [u8; 32]) {
    const PREFIX: &[u8] = b"/proc/self/fd/";
    buf[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut digits = [0u8; 10];
    let (mut n, mut i) = (fd as u32, 0);
    loop {
        digits[i] = b'0' + (n % 10) as u8;
        i += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for k in 0..i {
        buf[PREFIX.len() + k] = digits[i - 1 - k];
    }
    buf[PREFIX.len() + i] = 0;
}

/// Open `path` as whoever runs this and fill `r`; the opened fd when every check passed, else -1.
/// Raw libc only: this runs in a forked child.
unsafe fn probe(path: &CStr, write: bool, r: &mut Reply) -> i32 {
    let fd = libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
    if fd < 0 {
        r.stage = STAGE_OPEN;
        r.errno = errno();
        if r.errno == libc::EACCES {
            r.denied_at = first_denied_prefix(path.to_bytes());
        }
        return -1;
    }
    let mut st: libc::stat = std::mem::zeroed();
    if libc::fstat(fd, &mut st) != 0 {
        r.stage = STAGE_STAT;
        r.errno = errno();
        libc::close(fd);
        return -1;
    }
    (r.mode, r.dev, r.ino) = (st.st_mode, st.st_dev, st.st_ino);
    let mut link = [0u8; 32];
    fd_link(fd, &mut link);
    let link = link.as_ptr() as *const libc::c_char;
    let n = libc::readlink(link, r.path.as_mut_ptr() as *mut libc::c_char, PATH_CAP);
    if n < 0 || n as usize >= PATH_CAP {
        r.stage = STAGE_LINK;
        r.errno = if n < 0 { errno() } else { libc::ENAMETOOLONG };
    } else {
        r.len = n as u32;
        // access() follows the fd's magic link to the very inode opened, checked with this process's ids.
        if libc::access(link, libc::R_OK) != 0 {
            r.stage = STAGE_READ;
            r.errno = errno();
        } else if write && libc::access(link, libc::W_OK) != 0 {
            r.stage = STAGE_WRITE;
            r.errno = errno();
        }
    }
    if r.stage == OK {
        return fd;
    }
    libc::close(fd);
    -1
}

/// `mkdir -p` of the NUL-terminated path in `buf` (mode 0700 for what it makes) as whoever runs this;
/// on failure `r` names the errno and the prefix that failed. Raw libc only: this runs in a forked child.
unsafe fn make_dirs(buf: &mut [u8], r: &mut Reply) {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(0);
    for i in 1..=end {
        if i < end && buf[i] != b'/' {
            continue;
        }
        let saved = buf[i];
        buf[i] = 0;
        let failed = libc::mkdir(buf.as_ptr() as *const libc::c_char, 0o700) != 0 && errno() != libc::EEXIST;
        buf[i] = saved;
        if failed {
            (r.stage, r.errno, r.denied_at) = (STAGE_MKDIR, errno(), i as u32);
            return;
        }
    }
}

/// Room for one SCM_RIGHTS message carrying one fd (CMSG_SPACE(4) is 24 on 64-bit Linux).
#[repr(C, align(8))]
struct CmsgBuf([u8; 64]);

/// Send the reply as one datagram, with `fd` attached when it is valid. Raw libc only (forked child).
unsafe fn send_reply(sock: i32, r: &Reply, fd: i32) {
    let mut iov = libc::iovec { iov_base: r as *const Reply as *mut libc::c_void, iov_len: std::mem::size_of::<Reply>() };
    let mut cbuf = CmsgBuf([0; 64]);
    let mut msg: libc::msghdr = std::mem::zeroed();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if fd >= 0 {
        msg.msg_control = cbuf.0.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) as usize;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut i32, fd);
    }
    while libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) < 0 && errno() == libc::EINTR {}
}

/// Length of the shortest prefix of `path` that fails to open with EACCES (0: none found).
unsafe fn first_denied_prefix(path: &[u8]) -> u32 {
    let mut buf = [0u8; PATH_CAP];
    if path.len() >= PATH_CAP {
        return 0;
    }
    buf[..path.len()].copy_from_slice(path);
    for i in 1..=path.len() {
        if i < path.len() && buf[i] != b'/' {
            continue;
        }
        let saved = buf[i];
        buf[i] = 0;
        let fd = libc::open(buf.as_ptr() as *const libc::c_char, libc::O_PATH | libc::O_CLOEXEC);
        let e = errno();
        buf[i] = saved;
        if fd >= 0 {
            libc::close(fd);
        } else {
            return if e == libc::EACCES { i as u32 } else { 0 };
        }
    }
    0
}

/// Serializes forks, so a helper never inherits another helper's socket and delays its EOF.
static FORK: Mutex<()> = Mutex::new(());

/// What the helper does as the user.
#[derive(Clone, Copy)]
enum Op {
    /// [`probe`] the path: open it, report what it is and whether it may be read (and written).
    Probe { write: bool },
    /// [`make_dirs`]: create the path's missing folders.
    MakeDirs,
}

/// Run `op` in a child with `cred` (or with the engine's own ids when `become_user` is false): its
/// reply, and the file it opened when every check passed.
fn run_helper(cred: &Cred, path: &CStr, op: Op, become_user: bool) -> Result<(Reply, Option<OwnedFd>), std::io::Error> {
    let groups: Vec<libc::gid_t> = cred.groups.clone();
    // The child may not allocate: its copy of the path is made here.
    let mut buf = path.to_bytes_with_nul().to_vec();
    let (uid, gid) = (cred.uid as libc::uid_t, cred.gid as libc::gid_t);
    let mut fds = [0i32; 2];
    let guard = FORK.lock().unwrap_or_else(|p| p.into_inner());
    // SAFETY: plain syscalls on owned fds. After fork, the child runs only async-signal-safe code
    // (raw syscalls, stack buffers) and leaves with _exit.
    let pid = unsafe {
        // A datagram socket: the reply arrives whole, with the opened fd attached.
        if libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let pid = libc::fork();
        if pid == 0 {
            libc::close(fds[0]);
            let mut r: Reply = std::mem::zeroed();
            // Raw syscalls change only this thread's ids (glibc's wrappers would signal other threads,
            // which do not exist in the child). Groups first: after setresuid we may no longer set them.
            // A fork holds every file the engine has open, and `/proc/self/fd/N` (or `cwd`) would lead
            // the user to them past directories they may not enter: keep only the reply pipe, stand in `/`.
            let w = fds[1] as libc::c_uint;
            let isolated = (w == 0 || libc::syscall(libc::SYS_close_range, 0 as libc::c_uint, w - 1, 0 as libc::c_uint) == 0)
                && libc::syscall(libc::SYS_close_range, w + 1, libc::c_uint::MAX, 0 as libc::c_uint) == 0
                && libc::chdir(c"/".as_ptr()) == 0;
            let dropped = isolated
                && (!become_user
                    || (libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) == 0
                        && libc::syscall(libc::SYS_setresgid, gid, gid, gid) == 0
                        && libc::syscall(libc::SYS_setresuid, uid, uid, uid) == 0));
            let mut fd = -1;
            if !dropped {
                r.stage = STAGE_CRED;
                r.errno = errno();
            } else if let Op::Probe { write } = op {
                fd = probe(path, write, &mut r);
            } else {
                make_dirs(&mut buf, &mut r);
            }
            send_reply(fds[1], &r, fd);
            libc::_exit(0);
        }
        libc::close(fds[1]);
        if pid < 0 {
            let e = std::io::Error::last_os_error();
            libc::close(fds[0]);
            return Err(e);
        }
        pid
    };
    drop(guard);
    let got = read_reply(fds[0], Instant::now() + CHECK_TIMEOUT);
    // SAFETY: our own read end and child.
    unsafe {
        libc::close(fds[0]);
        if matches!(got, Err(ref e) if e.kind() == std::io::ErrorKind::TimedOut) {
            // It may be stuck in the kernel (hung NFS): kill it and reap it whenever it dies, off this thread.
            libc::kill(pid, libc::SIGKILL);
            std::thread::spawn(move || libc::waitpid(pid, std::ptr::null_mut(), 0));
        } else {
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
    }
    got
}

fn read_reply(sock: i32, deadline: Instant) -> Result<(Reply, Option<OwnedFd>), std::io::Error> {
    let mut buf = vec![0u8; std::mem::size_of::<Reply>()];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd { fd: sock, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n == 0 {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        if n < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return Err(std::io::Error::last_os_error());
        }
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
        let mut cbuf = CmsgBuf([0; 64]);
        // SAFETY: a zeroed msghdr pointing at our own buffers, within their lengths.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.0.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = cbuf.0.len();
        let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 && errno() == libc::EINTR {
            continue;
        }
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Take ownership of a passed fd first, so no error path leaks it.
        let mut file = None;
        // SAFETY: walks the control buffer the kernel filled, as CMSG_* define it.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    file = Some(OwnedFd::from_raw_fd(std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const i32)));
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the path-check helper died"));
        }
        if n as usize != buf.len() || msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "the path-check helper sent a malformed reply"));
        }
        // SAFETY: `buf` holds exactly one Reply, written by the helper from the same type; any bytes are valid.
        return Ok((unsafe { std::ptr::read_unaligned(buf.as_ptr() as *const Reply) }, file));
    }
}

fn kind_of(mode: u32) -> FileKind {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileKind::Directory,
        libc::S_IFREG => FileKind::File,
        libc::S_IFSOCK => FileKind::Other("socket"),
        libc::S_IFCHR | libc::S_IFBLK => FileKind::Other("device"),
        libc::S_IFIFO => FileKind::Other("named pipe"),
        _ => FileKind::Other("special file"),
    }
}

/// Resolve `host` (absolute) as `cred` would: every component searched and every symlink followed with
/// the user's own permissions, then read (and, with `write`, write) access checked on what it leads to.
pub fn resolve_as(cred: &Cred, host: &Path, write: bool) -> Result<Resolved, AccessError> {
    let io = |source: std::io::Error| AccessError::Io { path: host.to_path_buf(), source };
    if !host.is_absolute() {
        return Err(io(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not an absolute path")));
    }
    if host.as_os_str().len() >= PATH_CAP {
        return Err(io(std::io::Error::from_raw_os_error(libc::ENAMETOOLONG)));
    }
    let c = CString::new(host.as_os_str().as_bytes()).map_err(|e| io(e.into()))?;
    let euid = nix::unistd::geteuid().as_raw();
    if euid != 0 && euid != cred.uid {
        return Err(AccessError::CannotActAs { engine_uid: euid, uid: cred.uid });
    }
    let (r, file) = run_helper(cred, &c, Op::Probe { write }, euid == 0).map_err(|e| match e.kind() {
        std::io::ErrorKind::TimedOut => AccessError::Timeout { path: host.to_path_buf() },
        _ => io(e),
    })?;
    let resolved = PathBuf::from(std::ffi::OsStr::from_bytes(&r.path[..r.len as usize]));
    let os = std::io::Error::from_raw_os_error(r.errno);
    match r.stage {
        OK => {}
        STAGE_OPEN if r.errno == libc::ENOENT || r.errno == libc::ENOTDIR => return Err(AccessError::Missing { path: host.to_path_buf() }),
        STAGE_OPEN if r.errno == libc::EACCES => {
            return Err(AccessError::Unreachable { path: host.to_path_buf(), blocked: blocked_at(host, r.denied_at as usize) })
        }
        STAGE_READ => return Err(AccessError::NoRead { path: resolved }),
        STAGE_WRITE => return Err(AccessError::NoWrite { path: resolved, read_only_fs: r.errno == libc::EROFS }),
        STAGE_CRED => return Err(io(std::io::Error::new(os.kind(), format!("cannot set up the path check as uid {}: {os}", cred.uid)))),
        _ => return Err(io(os)),
    }
    let file = file.ok_or_else(|| io(std::io::Error::new(std::io::ErrorKind::InvalidData, "the path-check helper sent no file")))?;
    // The path the user's open led to must still be that file now, seen by the engine (which Docker is).
    match std::fs::metadata(&resolved) {
        Ok(m) if m.dev() == r.dev && m.ino() == r.ino => {}
        Ok(_) => return Err(AccessError::Changed { path: host.to_path_buf() }),
        Err(source) => return Err(AccessError::Io { path: resolved, source }),
    }
    Ok(Resolved { path: resolved, kind: kind_of(r.mode), dev: r.dev, ino: r.ino, file })
}

/// `mkdir -p path` (mode 0700) as `cred`, in a helper process with the user's own ids: a folder in a
/// home is made only where the user could make it, and a link they made leads only where they may go.
pub fn make_dirs_as(cred: &Cred, path: &Path) -> Result<(), AccessError> {
    let io = |source: std::io::Error| AccessError::Io { path: path.to_path_buf(), source };
    if !path.is_absolute() || path.as_os_str().len() >= PATH_CAP {
        return Err(io(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not an absolute path of a sensible length")));
    }
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|e| io(e.into()))?;
    let euid = nix::unistd::geteuid().as_raw();
    if euid != 0 && euid != cred.uid {
        return Err(AccessError::CannotActAs { engine_uid: euid, uid: cred.uid });
    }
    let (r, _) = run_helper(cred, &c, Op::MakeDirs, euid == 0).map_err(|e| match e.kind() {
        std::io::ErrorKind::TimedOut => AccessError::Timeout { path: path.to_path_buf() },
        _ => io(e),
    })?;
    let os = std::io::Error::from_raw_os_error(r.errno);
    match r.stage {
        OK => Ok(()),
        STAGE_MKDIR => {
            let failed = Path::new(std::ffi::OsStr::from_bytes(&c.as_bytes()[..(r.denied_at as usize).min(c.as_bytes().len())]));
            Err(io(std::io::Error::new(os.kind(), format!("{} cannot create {}: {os}", cred.name, failed.display()))))
        }
        _ => Err(io(std::io::Error::new(os.kind(), format!("cannot act as {}: {os}", cred.name)))),
    }
}

/// Where a path stopped the user: the prefix that failed is a symlink they could not follow, or lies in
/// a directory they may not search. Only for the message: the decision was the kernel's.
fn blocked_at(host: &Path, denied_at: usize) -> Option<String> {
    let bytes = host.as_os_str().as_bytes();
    if denied_at == 0 || denied_at > bytes.len() {
        return None;
    }
    let prefix = Path::new(std::ffi::OsStr::from_bytes(&bytes[..denied_at]));
    if std::fs::symlink_metadata(prefix).is_ok_and(|m| m.file_type().is_symlink()) {
        return Some(format!("following the symlink {}", prefix.display()));
    }
    prefix.parent().map(|p| format!("on {} (no permission to enter it)", p.display()))
}

// ---- What no job may mount ----

/// Host paths whose ancestors, themselves and contents no job may mount: the container engine's
/// sockets and the engine's own state. Compared after symlinks are resolved on both sides.
#[derive(Debug, Clone, Default)]
pub struct Forbidden {
    entries: Vec<(PathBuf, &'static str)>,
    /// Subtrees that may be mounted although they lie inside an entry: the drop folder, which may sit in
    /// the state dir, holds the config files template jobs mount.
    exempt: Vec<PathBuf>,
}

impl Forbidden {
    /// For an engine with this state dir, socket and drop folder (the Docker socket from `DOCKER_HOST` too).
    pub fn for_engine(state_dir: &Path, socket: &Path, inbox: &Path) -> Forbidden {
        let mut f = Forbidden::default();
        if let Some(p) = std::env::var("DOCKER_HOST").ok().as_deref().and_then(|h| h.strip_prefix("unix://")) {
            f.add(Path::new(p), "the Docker socket");
        }
        for p in ["/var/run/docker.sock", "/run/docker.sock"] {
            f.add(Path::new(p), "the Docker socket");
        }
        f.add(Path::new("/run/containerd/containerd.sock"), "the containerd socket");
        f.add(Path::new("/run/containerd"), "containerd's runtime directory");
        f.add(Path::new("/var/run/docker"), "Docker's runtime directory");
        f.add(state_dir, "the Gantry state directory");
        f.add(socket, "the Gantry socket");
        // The system socket lives outside the state dir (`/run/gantry`): its folder is as private.
        if let Some(dir) = socket.parent() {
            f.add(dir, "the Gantry socket's folder");
        }
        f.exempt = [Some(inbox.to_path_buf()), std::fs::canonicalize(inbox).ok()].into_iter().flatten().collect();
        f
    }

    /// Both the path as given and as it resolves now (a missing last component is kept as is).
    fn add(&mut self, p: &Path, what: &'static str) {
        let canon = std::fs::canonicalize(p).ok().or_else(|| {
            let parent = std::fs::canonicalize(p.parent()?).ok()?;
            Some(parent.join(p.file_name()?))
        });
        for q in [Some(p.to_path_buf()), canon].into_iter().flatten() {
            if !self.entries.iter().any(|(e, _)| *e == q) {
                self.entries.push((q, what));
            }
        }
    }

    /// Why `p` may not be mounted, if it may not.
    pub fn refusal(&self, p: &Path) -> Option<String> {
        if p.parent().is_none() {
            return Some("is the root of the host file system".into());
        }
        self.entries.iter().find_map(|(f, what)| {
            if f == p {
                Some(format!("is {what}"))
            } else if f.starts_with(p) {
                Some(format!("contains {what} ({})", f.display()))
            } else if p.starts_with(f) && !self.exempt.iter().any(|x| p.starts_with(x)) {
                Some(format!("lies inside {what} ({})", f.display()))
            } else {
                None
            }
        })
    }
}

// ---- Mounts ----

/// A mount as handed to Docker: `host` is the resolved path, or the staging path that pins it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedMount {
    pub host: PathBuf,
    pub container: String,
    pub read_only: bool,
}

/// A mount that passed the check, with the file the owner's own open reached.
#[derive(Debug)]
pub struct CheckedMount {
    /// `host` is the resolved path.
    pub mount: ResolvedMount,
    /// Kept open so the engine can mount exactly this file ([`crate::staging`]).
    pub file: OwnedFd,
}

/// Check every mount as `cred` and resolve it, and what the job's `workdir` needs of them; the first
/// refusal says which mount, why, and how to fix it.
pub fn check_mounts(cred: &Cred, mounts: &[Mount], workdir: Option<&str>, forbidden: &Forbidden) -> Result<Vec<CheckedMount>, SpecError> {
    let checked = mounts.iter().map(|m| check_mount(cred, m, forbidden)).collect::<Result<Vec<_>, _>>()?;
    let resolved: Vec<ResolvedMount> = checked.iter().map(|c| c.mount.clone()).collect();
    check_nested(cred, &resolved, workdir)?;
    Ok(checked)
}

/// [`check_mounts`] off the async runtime (the helper may wait up to [`CHECK_TIMEOUT`] per path).
pub async fn check_mounts_async(cred: Cred, mounts: Vec<Mount>, workdir: Option<String>, forbidden: Forbidden) -> Result<Vec<CheckedMount>, SpecError> {
    tokio::task::spawn_blocking(move || check_mounts(&cred, &mounts, workdir.as_deref(), &forbidden))
        .await
        .unwrap_or_else(|e| Err(SpecError::new(format!("checking the mounts failed: {e}"), "submit the job again")))
}

fn check_mount(cred: &Cred, m: &Mount, forbidden: &Forbidden) -> Result<CheckedMount, SpecError> {
    let shown = format!("{}:{}{}", m.host, m.container, if m.read_only { ":ro" } else { "" });
    let who = &cred.name;
    let refuse = |what: String, hint: String| SpecError::new(format!("mount {shown:?}: {what}"), hint);
    // The spec's path, and where it led when that differs (a symlink).
    let named = |p: &Path| if p == Path::new(&m.host) { m.host.clone() } else { format!("{} (which leads to {})", m.host, p.display()) };
    let not_allowed = |p: &Path, why: String| {
        refuse(format!("{} {why}; jobs may not mount it", named(p)), "mount only the folders the job needs, e.g. a data or output folder of yours".into())
    };
    const AS_USER: &str = "Gantry checks host paths with the submitter's own permissions";
    let r = match resolve_as(cred, Path::new(&m.host), !m.read_only) {
        Ok(r) => r,
        Err(e) => {
            if let Some((p, why)) = e.resolved().and_then(|p| forbidden.refusal(p).map(|w| (p, w))) {
                return Err(not_allowed(p, why));
            }
            return Err(match e {
                AccessError::Missing { .. } => refuse(
                    format!("{} does not exist", m.host),
                    "create it first, as yourself (Gantry never creates host paths), or fix the path".into(),
                ),
                AccessError::Unreachable { blocked, .. } => refuse(
                    format!("{who} cannot reach {}: permission denied{}. {AS_USER}", m.host, blocked.map(|b| format!(" {b}")).unwrap_or_default()),
                    "mount only paths you can open yourself: ask the owner for access, or copy the data to a folder of yours".into(),
                ),
                AccessError::NoRead { ref path } => refuse(
                    format!("{who} cannot read {}. {AS_USER}", named(path)),
                    "mount only files and folders you can read yourself: ask the owner for read access".into(),
                ),
                AccessError::NoWrite { ref path, read_only_fs } => refuse(
                    format!(
                        "{who} cannot write {}{}, and the mount is read-write. {AS_USER}",
                        named(path),
                        if read_only_fs { " (a read-only file system)" } else { "" }
                    ),
                    format!("add `:ro` (`{}:{}:ro`) if the job only reads it, or mount a folder you can write", m.host, m.container),
                ),
                AccessError::CannotActAs { engine_uid, .. } => refuse(
                    format!("cannot check {} as {who}: {e}", m.host),
                    format!("a Gantry engine serving several users runs as root; this one only takes mounts from uid {engine_uid}"),
                ),
                AccessError::Timeout { .. } | AccessError::Changed { .. } | AccessError::Io { .. } => {
                    refuse(format!("cannot check {} as {who}: {e}", m.host), "make sure the path is reachable, then submit again".into())
                }
            });
        }
    };
    if let Some(why) = forbidden.refusal(&r.path) {
        return Err(not_allowed(&r.path, why));
    }
    if let FileKind::Other(kind) = r.kind {
        return Err(refuse(format!("{} is a {kind}; only files and folders can be mounted", named(&r.path)), "mount a file or a folder".into()));
    }
    Ok(CheckedMount { mount: ResolvedMount { host: r.path, container: m.container.clone(), read_only: m.read_only }, file: r.file })
}

/// Docker (runc) makes a missing mount point or working directory as root, and inside another mount
/// that is a host folder: a job could leave root-owned entries in any folder its owner may write. So
/// what lies inside a mount must already exist there, reached without symbolic links (runc follows
/// those inside the container, to somewhere else than the check saw).
fn check_nested(cred: &Cred, mounts: &[ResolvedMount], workdir: Option<&str>) -> Result<(), SpecError> {
    let targets: Vec<String> = mounts.iter().map(|m| crate::spec::normalize(Path::new(&m.container))).collect();
    let workdir = workdir.map(|w| crate::spec::normalize(Path::new(w))).filter(|w| !targets.contains(w));
    let wanted = targets.iter().map(|t| (t, "mount point")).chain(workdir.as_ref().map(|w| (w, "`workdir`")));
    for (t, what) in wanted {
        let inside = |p: &&String| *p != t && p.as_str() != "/" && Path::new(t).starts_with(p.as_str());
        let Some((i, outer)) = targets.iter().enumerate().filter(|(_, p)| inside(p)).max_by_key(|(_, p)| p.len()) else { continue };
        let host = mounts[i].host.join(Path::new(t).strip_prefix(outer).unwrap_or(Path::new("")));
        let refuse = |why: String, hint: String| {
            SpecError::new(format!("{what} {t} lies inside the mount of {} at {outer}, and {why}", mounts[i].host.display()), hint)
        };
        match resolve_as(cred, &host, false) {
            Ok(r) if r.path == host => {}
            Ok(r) => {
                return Err(refuse(
                    format!("{} goes through a symbolic link (to {}), which Docker would follow inside the container", host.display(), r.path.display()),
                    "mount the link's target itself, or use the real path".into(),
                ))
            }
            Err(AccessError::Missing { .. }) => {
                return Err(refuse(
                    format!("{} does not exist: Docker would create it as root", host.display()),
                    format!("create {} first, as yourself (a folder, or an empty file for a file mount)", host.display()),
                ))
            }
            Err(e) => return Err(refuse(format!("{} cannot be checked as {}: {e}", host.display(), cred.name), "make sure you can reach it yourself".into())),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forbidden() -> Forbidden {
        Forbidden {
            entries: vec![
                (PathBuf::from("/run/docker.sock"), "the Docker socket"),
                (PathBuf::from("/srv/g"), "the Gantry state directory"),
                (PathBuf::from("/srv/g/gantry.sock"), "the Gantry socket"),
            ],
            exempt: vec![PathBuf::from("/srv/g/inbox")],
        }
    }

    #[test]
    fn forbidden_refuses_the_paths_their_ancestors_and_their_contents() {
        let f = forbidden();
        let refused = |p: &str| f.refusal(Path::new(p));
        assert_eq!(refused("/").as_deref(), Some("is the root of the host file system"));
        assert_eq!(refused("/run/docker.sock").as_deref(), Some("is the Docker socket"));
        assert!(refused("/run").unwrap().starts_with("contains the Docker socket"), "{:?}", refused("/run"));
        assert!(refused("/srv").unwrap().contains("contains the Gantry state directory"));
        assert_eq!(refused("/srv/g").as_deref(), Some("is the Gantry state directory"));
        assert!(refused("/srv/g/logs").unwrap().starts_with("lies inside the Gantry state directory"));
        assert!(refused("/srv/g/gantry.sock").is_some());
        // The drop folder may live in the state dir: what lies in it may be mounted, the state dir may not.
        assert_eq!(refused("/srv/g/inbox/paddle/accepted/7-exp.yaml"), None);
        assert_eq!(refused("/srv/g/inbox"), None);
        assert!(refused("/srv/g/inboxes").is_some());
        // Whole components only: neighbours with a common prefix are fine.
        for ok in ["/run2", "/srv/gx", "/srv/other", "/home/alice", "/run/user/1000"] {
            assert_eq!(refused(ok), None, "{ok}");
        }
    }

    #[test]
    fn forbidden_for_the_system_engine_covers_the_socket_folder() {
        let d = tempfile::tempdir().unwrap();
        let p = crate::config::Paths::system(d.path());
        let f = Forbidden::for_engine(&p.state_dir, &p.socket(), &p.inbox);
        let run = d.path().join("run/gantry");
        assert!(f.refusal(&run).unwrap().starts_with("contains the Gantry socket"));
        assert!(f.refusal(&run.join("x")).unwrap().starts_with("lies inside the Gantry socket's folder"));
        assert!(f.refusal(&d.path().join("run")).unwrap().starts_with("contains the Gantry socket"));
        assert!(f.refusal(&d.path().join("var/lib/gantry")).is_some());
        assert_eq!(f.refusal(&d.path().join("run/other")), None);
    }

    #[test]
    fn forbidden_for_engine_resolves_symlinks_and_missing_sockets() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        // The engine named its state dir through a symlink, and its socket does not exist yet.
        let f = Forbidden::for_engine(&link, &link.join("gantry.sock"), &link.join("inbox"));
        assert_eq!(f.refusal(&real).as_deref(), Some("is the Gantry state directory"));
        assert!(f.refusal(&real.join("gantry.sock")).is_some());
        assert!(f.refusal(d.path()).unwrap().starts_with("contains the Gantry state directory"));
        assert!(f.refusal(Path::new("/var/run/docker.sock")).is_some());
        assert!(f.refusal(&std::fs::canonicalize("/var/run").unwrap()).is_some());
    }

    #[test]
    fn what_lies_inside_a_mount_must_exist_there_without_links() {
        let d = tempfile::tempdir().unwrap();
        let top = std::fs::canonicalize(d.path()).unwrap();
        std::fs::create_dir_all(top.join("proj/src")).unwrap();
        std::os::unix::fs::symlink("/etc", top.join("proj/link")).unwrap();
        let m = |host: &Path, c: &str| Mount { host: host.to_string_lossy().into_owned(), container: c.into(), read_only: true };
        let none = Forbidden::default();
        let check = |mounts: &[Mount], wd: Option<&str>| check_mounts(&me(), mounts, wd, &none).map(|_| ()).map_err(|e| e.message);
        let proj = top.join("proj");
        assert_eq!(check(&[m(&proj, "/w"), m(&top, "/w/src")], Some("/w/src/../src")), Ok(()));
        assert_eq!(check(&[m(&proj, "/w")], Some("/w")), Ok(()));
        assert_eq!(check(&[m(&proj, "/w")], Some("/elsewhere/new")), Ok(()), "the image's own folders are Docker's business");
        let e = check(&[m(&proj, "/w"), m(&top, "/w/data/x")], None).unwrap_err();
        assert!(e.contains("mount point /w/data/x lies inside the mount of") && e.contains("does not exist"), "{e}");
        let e = check(&[m(&proj, "/w")], Some("/w/src/../new")).unwrap_err();
        assert!(e.contains("`workdir` /w/new") && e.contains("Docker would create it as root"), "{e}");
        let e = check(&[m(&proj, "/w")], Some("/w/link")).unwrap_err();
        assert!(e.contains("symbolic link"), "{e}");
        assert!(!proj.join("data").exists() && !proj.join("new").exists());
    }

    #[test]
    fn fd_link_formats_numbers() {
        for (fd, want) in [(0, "/proc/self/fd/0"), (7, "/proc/self/fd/7"), (1234, "/proc/self/fd/1234")] {
            let mut b = [0u8; 32];
            fd_link(fd, &mut b);
            assert_eq!(CStr::from_bytes_until_nul(&b).unwrap().to_str().unwrap(), want);
        }
    }

    fn me() -> Cred {
        let (uid, gid) = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
        Cred::of_user(uid, gid)
    }

    #[test]
    fn resolve_as_follows_symlinks_and_reports_what_it_found() {
        let d = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(d.path()).unwrap().join("data");
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::symlink(&dir, d.path().join("link")).unwrap();
        let r = resolve_as(&me(), &d.path().join("link"), true).unwrap();
        assert_eq!(r.path, dir);
        assert_eq!(r.kind, FileKind::Directory);
        assert_eq!(r.ino, std::fs::metadata(&dir).unwrap().ino());
        // The helper hands back the file its open reached.
        assert_eq!(nix::sys::stat::fstat(&r.file).unwrap().st_ino, r.ino);
        assert!(matches!(resolve_as(&me(), &d.path().join("nope/x"), false), Err(AccessError::Missing { .. })));
    }

    #[test]
    fn the_check_uses_the_users_permissions_not_the_engines() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(d.path()).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let secret = dir.join("secret");
        std::fs::create_dir(&secret).unwrap();
        std::fs::write(secret.join("flag"), "x").unwrap(); // 644
        std::os::unix::fs::symlink(secret.join("flag"), dir.join("link")).unwrap();
        let nobody = Cred { uid: 65534, gid: 65534, groups: vec![65534], name: "nobody".into() };
        let got = resolve_as(&nobody, &secret.join("flag"), false);
        if !nix::unistd::geteuid().is_root() {
            assert!(matches!(got, Err(AccessError::CannotActAs { uid: 65534, .. })), "{got:?}");
            return;
        }
        match got {
            Err(AccessError::Unreachable { blocked: Some(b), .. }) => assert_eq!(b, format!("on {} (no permission to enter it)", dir.display())),
            other => panic!("{other:?}"),
        }
        // The way in is open, the last step is not: the message names the symlink that led there.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o700)).unwrap();
        match resolve_as(&nobody, &dir.join("link"), false) {
            Err(AccessError::Unreachable { blocked: Some(b), .. }) => assert_eq!(b, format!("following the symlink {}", dir.join("link").display())),
            other => panic!("{other:?}"),
        }
        // Readable but not writable: fine read-only, refused read-write with a fix.
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(resolve_as(&nobody, &dir.join("link"), false).unwrap().path, secret.join("flag"));
        let m = Mount { host: dir.join("link").to_string_lossy().into_owned(), container: "/f".into(), read_only: false };
        let e = check_mounts(&nobody, &[m], None, &Forbidden::default()).unwrap_err();
        assert!(e.message.contains("nobody cannot write") && e.message.contains("which leads to"), "{e}");
        assert!(e.hint.contains(":ro"), "{e}");
    }

    #[test]
    fn folders_are_made_with_the_users_permissions_only() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let top = std::fs::canonicalize(d.path()).unwrap();
        make_dirs_as(&me(), &top.join("a/b/c")).unwrap();
        make_dirs_as(&me(), &top.join("a/b/c")).unwrap(); // already there: fine
        assert_eq!(std::fs::metadata(top.join("a/b/c")).unwrap().permissions().mode() & 0o777, 0o700);
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        // nobody's link into a folder only root may write: followed as nobody, so nothing is made.
        std::fs::set_permissions(&top, std::fs::Permissions::from_mode(0o755)).unwrap();
        let home = top.join("home");
        std::fs::create_dir(&home).unwrap();
        std::os::unix::fs::lchown(&home, Some(65534), Some(65534)).unwrap();
        std::os::unix::fs::symlink(top.join("a"), home.join("link")).unwrap();
        let nobody = Cred { uid: 65534, gid: 65534, groups: vec![65534], name: "nobody".into() };
        let e = make_dirs_as(&nobody, &home.join("link/x")).unwrap_err();
        assert!(e.to_string().contains("nobody cannot create") && e.to_string().contains("link/x"), "{e}");
        assert!(!top.join("a/x").exists());
        make_dirs_as(&nobody, &home.join("G/inbox")).unwrap();
        assert_eq!(std::fs::metadata(home.join("G/inbox")).unwrap().uid(), 65534);
    }

    #[test]
    fn check_mounts_mounts_the_resolved_path_and_never_a_missing_one() {
        let d = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(d.path()).unwrap();
        std::os::unix::fs::symlink(&real, real.join("link")).unwrap();
        let m = |host: &Path, ro| Mount { host: host.to_string_lossy().into_owned(), container: "/d".into(), read_only: ro };
        let none = Forbidden::default();
        let got: Vec<ResolvedMount> = check_mounts(&me(), &[m(&real.join("link"), true)], None, &none).unwrap().into_iter().map(|c| c.mount).collect();
        assert_eq!(got, vec![ResolvedMount { host: real.clone(), container: "/d".into(), read_only: true }]);
        let e = check_mounts(&me(), &[m(&real.join("missing"), false)], None, &none).unwrap_err();
        assert!(e.message.contains("does not exist") && e.message.contains("missing:/d"), "{e}");
        assert!(e.hint.contains("never creates host paths"), "{e}");
        assert!(!real.join("missing").exists());
        let e = check_mounts(&me(), &[m(Path::new("/"), true)], None, &none).unwrap_err();
        assert!(e.message.contains("root of the host file system"), "{e}");
    }
}
