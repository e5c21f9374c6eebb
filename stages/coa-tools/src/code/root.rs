//! The minimal root a namespaced run sees, as bubblewrap builds one: a tmpfs holding the
//! interpreter and its libraries (`/usr`, the `/bin` and `/lib*` links or directories, the
//! interpreter's own prefix when it lives elsewhere) read-only, a few files of `/etc` that
//! programs and the dynamic linker read, `/dev/null`-class devices, a fresh `/proc`, and the
//! run's size-limited `/tmp` and `/dev/shm`; nothing else of the host: no repository, no
//! `runs/`, no task files, no home. The run's init builds it in its mount namespace and
//! `pivot_root`s into it, detaching the host's tree.
//!
//! What to mount is decided here, in the stage, once; [`NewRoot::enter`] runs between fork and
//! exec and only makes syscalls on those prepared paths.

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::child::{errno, make_read_only, Step};

/// Where the new root is assembled before the pivot (a tmpfs mounted over the host's `/tmp`,
/// which the new root hides anyway).
const STAGING: &str = "/tmp";
/// Top-level host paths a Python install needs: directories are bound read-only, links (merged
/// `/usr`: `/bin -> usr/bin`) recreated.
const SYSTEM: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];
/// Host files a program may read: the dynamic linker's cache, the time zone, user and group
/// names, name service configuration. Bound where they exist.
const ETC: &[&str] = &["/etc/ld.so.cache", "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf"];
/// Device nodes bound from the host.
const DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"];

/// A run's root, prepared (all paths under [`STAGING`]).
pub(crate) struct NewRoot {
    /// Directories to create, parents first.
    dirs: Vec<CString>,
    /// (target, link) symlinks to create.
    links: Vec<(CString, CString)>,
    /// Empty files to create as mount points of file binds.
    files: Vec<CString>,
    /// (host path, mount point) read-only bind mounts.
    binds: Vec<(CString, CString)>,
    tmp: CString,
    shm: CString,
    proc_: CString,
}

fn c(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).expect("paths from the file system have no NUL")
}

fn staged(path: &Path) -> PathBuf {
    Path::new(STAGING).join(path.strip_prefix("/").unwrap_or(path))
}

impl NewRoot {
    /// The root for runs of `python` (its real path).
    pub(crate) fn for_interpreter(python: &Path) -> NewRoot {
        let mut root = NewRoot { dirs: Vec::new(), links: Vec::new(), files: Vec::new(), binds: Vec::new(), tmp: c(&staged(Path::new("/tmp"))), shm: c(&staged(Path::new("/dev/shm"))), proc_: c(&staged(Path::new("/proc"))) };
        let mut dirs: Vec<PathBuf> = ["/tmp", "/dev", "/dev/shm", "/proc", "/etc"].iter().map(PathBuf::from).collect();
        let mut bound: Vec<PathBuf> = Vec::new();
        for top in SYSTEM.iter().map(Path::new) {
            match std::fs::symlink_metadata(top) {
                Ok(m) if m.file_type().is_symlink() => {
                    if let Ok(target) = std::fs::read_link(top) {
                        root.links.push((c(&target), c(&staged(top))));
                    }
                }
                Ok(m) if m.is_dir() => {
                    dirs.push(top.to_path_buf());
                    bound.push(top.to_path_buf());
                }
                _ => {}
            }
        }
        // An interpreter outside those (/opt/python3.12/bin/python3): its install prefix too.
        let resolved: Vec<PathBuf> = bound.iter().map(|b| std::fs::canonicalize(b).unwrap_or_else(|_| b.clone())).collect();
        if let Some(prefix) = python.parent().and_then(Path::parent) {
            if !resolved.iter().any(|b| python.starts_with(b)) && prefix != Path::new("/") {
                dirs.extend(prefix.ancestors().filter(|a| *a != Path::new("/")).map(Path::to_path_buf).collect::<Vec<_>>().into_iter().rev());
                bound.push(prefix.to_path_buf());
            }
        }
        for path in ETC.iter().chain(DEVICES).map(Path::new).filter(|p| p.exists()) {
            root.files.push(c(&staged(path)));
            root.binds.push((c(path), c(&staged(path))));
        }
        for (link, target) in [("/dev/fd", "/proc/self/fd"), ("/dev/stdin", "/proc/self/fd/0"), ("/dev/stdout", "/proc/self/fd/1"), ("/dev/stderr", "/proc/self/fd/2")] {
            root.links.push((c(Path::new(target)), c(&staged(Path::new(link)))));
        }
        root.dirs = dirs.iter().map(|d| c(&staged(d))).collect();
        root.binds.extend(bound.iter().map(|b| (c(b), c(&staged(b)))));
        root
    }

    /// In the run's init, with a private mount tree: builds the root over [`STAGING`], mounts the
    /// run's tmpfs (`tmp_options`) on its `/tmp` and `/dev/shm` and a procfs, and pivots into it.
    ///
    /// # Safety
    /// Between fork and exec: raw syscalls on prepared paths only.
    pub(crate) unsafe fn enter(&self, tmp_options: &CStr) -> Result<(), (Step, i32)> {
        let fail = || (Step::NewRoot, errno());
        let mount = |src: &CStr, target: &CStr, fstype: Option<&CStr>, flags: libc::c_ulong, data: Option<&CStr>| {
            libc::mount(src.as_ptr(), target.as_ptr(), fstype.map_or(std::ptr::null(), CStr::as_ptr), flags, data.map_or(std::ptr::null(), |d| d.as_ptr().cast()))
        };
        if mount(c"tmpfs", c"/tmp", Some(c"tmpfs"), libc::MS_NOSUID | libc::MS_NODEV, Some(c"size=1m,nr_inodes=256,mode=0755")) != 0 {
            return Err(fail());
        }
        for dir in &self.dirs {
            if libc::mkdir(dir.as_ptr(), 0o755) != 0 && errno() != libc::EEXIST {
                return Err(fail());
            }
        }
        for (target, link) in &self.links {
            if libc::symlink(target.as_ptr(), link.as_ptr()) != 0 {
                return Err(fail());
            }
        }
        for file in &self.files {
            let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC, 0o644);
            if fd < 0 {
                return Err(fail());
            }
            libc::close(fd);
        }
        for (src, target) in &self.binds {
            if mount(src, target, None, libc::MS_BIND | libc::MS_REC, None) != 0 {
                return Err(fail());
            }
        }
        // Everything so far read-only (the binds included), then the writable run mounts on top.
        make_read_only(c"/tmp");
        if mount(c"tmpfs", &self.tmp, Some(c"tmpfs"), libc::MS_NOSUID | libc::MS_NODEV, Some(tmp_options)) != 0 {
            return Err((Step::MountTmp, errno()));
        }
        // Best effort, as on the host's tree: multiprocessing's semaphores live in /dev/shm; a
        // container may refuse a fresh procfs.
        mount(c"tmpfs", &self.shm, Some(c"tmpfs"), libc::MS_NOSUID | libc::MS_NODEV, Some(tmp_options));
        mount(c"proc", &self.proc_, Some(c"proc"), libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC, None);
        // pivot_root(".", "."): the new root on top, the old one beneath it, then detached.
        if libc::chdir(c"/tmp".as_ptr()) != 0
            || libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) != 0
            || libc::umount2(c".".as_ptr(), libc::MNT_DETACH) != 0
            || libc::chdir(c"/".as_ptr()) != 0
        {
            return Err(fail());
        }
        Ok(())
    }
}
