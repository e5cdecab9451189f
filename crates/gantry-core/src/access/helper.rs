//! The helper process: forked, takes the submitter's credentials, opens the path with `O_PATH` and hands
//! the file back (SCM_RIGHTS). Raw async-signal-safe calls only; every buffer is made before `fork`.

#[allow(unused_imports)]
use super::*;
use std::ffi::CStr;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Mutex;
use std::time::Instant;

pub(super) const PATH_CAP: usize = libc::PATH_MAX as usize;

pub(super) const OK: u32 = 0;
pub(super) const STAGE_CRED: u32 = 1;
pub(super) const STAGE_OPEN: u32 = 2;
pub(super) const STAGE_STAT: u32 = 3;
pub(super) const STAGE_LINK: u32 = 4;
pub(super) const STAGE_READ: u32 = 5;
pub(super) const STAGE_WRITE: u32 = 6;
pub(super) const STAGE_MKDIR: u32 = 7;

/// What the helper writes back through the pipe, as plain bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct Reply {
    pub(super) stage: u32,
    pub(super) errno: i32,
    pub(super) mode: u32,
    /// Length of the first prefix of the path the user could not open (EACCES); 0 when unknown.
    pub(super) denied_at: u32,
    pub(super) dev: u64,
    pub(super) ino: u64,
    pub(super) len: u32,
    pub(super) _pad: u32,
    pub(super) path: [u8; PATH_CAP],
}

pub(super) fn errno() -> i32 {
    // SAFETY: reads the calling thread's errno; async-signal-safe.
    unsafe { *libc::__errno_location() }
}

/// `/proc/self/fd/<fd>` into `buf`, NUL-terminated, without allocating.
pub(super) fn fd_link(fd: i32, buf: &mut [u8; 32]) {
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
pub(super) struct CmsgBuf([u8; 64]);

/// Send the reply as one datagram, with `fd` attached when it is valid. Raw libc only (forked child).
unsafe fn send_reply(sock: i32, r: &Reply, fd: i32) {
    let mut iov = libc::iovec {
        iov_base: r as *const Reply as *mut libc::c_void,
        iov_len: std::mem::size_of::<Reply>(),
    };
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
pub(super) static FORK: Mutex<()> = Mutex::new(());

/// What the helper does as the user.
#[derive(Clone, Copy)]
pub(super) enum Op {
    /// [`probe`] the path: open it, report what it is and whether it may be read (and written).
    Probe { write: bool },
    /// [`make_dirs`]: create the path's missing folders.
    MakeDirs,
}

/// Run `op` in a child with `cred` (or with the engine's own ids when `become_user` is false): its
/// reply, and the file it opened when every check passed.
pub(super) fn run_helper(
    cred: &Cred,
    path: &CStr,
    op: Op,
    become_user: bool,
) -> Result<(Reply, Option<OwnedFd>), std::io::Error> {
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
        if libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        ) != 0
        {
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
            let isolated = (w == 0
                || libc::syscall(libc::SYS_close_range, 0 as libc::c_uint, w - 1, 0 as libc::c_uint) == 0)
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

pub(super) fn read_reply(sock: i32, deadline: Instant) -> Result<(Reply, Option<OwnedFd>), std::io::Error> {
    let mut buf = vec![0u8; std::mem::size_of::<Reply>()];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd {
            fd: sock,
            events: libc::POLLIN,
            revents: 0,
        };
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
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
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
                    file = Some(OwnedFd::from_raw_fd(std::ptr::read_unaligned(
                        libc::CMSG_DATA(c) as *const i32
                    )));
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the path-check helper died",
            ));
        }
        if n as usize != buf.len() || msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the path-check helper sent a malformed reply",
            ));
        }
        // SAFETY: `buf` holds exactly one Reply, written by the helper from the same type; any bytes are valid.
        return Ok((unsafe { std::ptr::read_unaligned(buf.as_ptr() as *const Reply) }, file));
    }
}
