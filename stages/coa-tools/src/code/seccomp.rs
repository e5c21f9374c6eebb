//! The seccomp filter of every sandboxed process (and everything it starts; filters survive exec
//! and fork), compiled to BPF by `seccompiler` (rust-vmm) once per stage, before any fork.
//!
//! A denylist answering EPERM: what lets a process reach into another one or out of its
//! namespaces and limits (`ptrace`, `process_vm_readv`/`writev`, `kcmp`), create namespaces
//! (`unshare`, `setns`, `clone` with any `CLONE_NEW*` flag: `unshare -Urm` fails), mount
//! anything (the mount API old and new, `pivot_root`, `chroot`), load code or filters into the
//! kernel (`bpf`, modules, `kexec`), watch the machine (`perf_event_open`, `syslog`), reach the
//! keyrings (`keyctl`, `add_key`, `request_key`), open files by handle, `userfaultfd`, swap,
//! reboot, and io_uring (whose operations bypass this filter). `clone3` gets ENOSYS instead: its
//! flags live in memory a filter cannot read, and glibc falls back to `clone`, which is checked.
//! Nothing an ordinary Python program (threads, subprocess, multiprocessing) needs is refused.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use seccompiler::{BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch};

/// Refused with EPERM whatever their arguments.
const DENIED: &[libc::c_long] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_kcmp,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_syslog,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_userfaultfd,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
];

/// `clone` flags that make a namespace: `clone` with any of them is refused.
const NAMESPACE_FLAGS: &[libc::c_int] =
    &[libc::CLONE_NEWUSER, libc::CLONE_NEWNS, libc::CLONE_NEWPID, libc::CLONE_NEWNET, libc::CLONE_NEWIPC, libc::CLONE_NEWUTS, libc::CLONE_NEWCGROUP];

/// The two BPF programs a sandboxed process installs (the kernel runs both on every syscall).
pub(crate) struct Filters {
    /// EPERM for [`DENIED`] and namespace-making `clone`s.
    deny: BpfProgram,
    /// ENOSYS for `clone3`.
    no_clone3: BpfProgram,
}

/// The filters, compiled once; `Err` says why they cannot be (an architecture seccompiler lacks).
pub(crate) fn filters() -> Result<&'static Filters, String> {
    static COMPILED: OnceLock<Result<Filters, String>> = OnceLock::new();
    COMPILED.get_or_init(|| compile().map_err(|e| format!("compiling the seccomp filter: {e}"))).as_ref().map_err(Clone::clone)
}

fn compile() -> Result<Filters, seccompiler::Error> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = DENIED.iter().map(|&nr| (nr as i64, Vec::new())).collect();
    let clone_rules = NAMESPACE_FLAGS
        .iter()
        .map(|&flag| SeccompRule::new(vec![SeccompCondition::new(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(flag as u64), flag as u64)?]))
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_clone as i64, clone_rules);
    let deny = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch)?.try_into()?;
    let clone3 = BTreeMap::from([(libc::SYS_clone3 as i64, Vec::new())]);
    let no_clone3 = SeccompFilter::new(clone3, SeccompAction::Allow, SeccompAction::Errno(libc::ENOSYS as u32), arch)?.try_into()?;
    Ok(Filters { deny, no_clone3 })
}

impl Filters {
    /// Installs both filters on the calling thread (no_new_privs is set first, as the kernel
    /// requires of an unprivileged process). Between fork and exec: no allocation on success.
    pub(crate) fn apply(&self) -> Result<(), i32> {
        for program in [&self.deny, &self.no_clone3] {
            if let Err(e) = seccompiler::apply_filter(program) {
                return Err(match e {
                    seccompiler::Error::Prctl(e) | seccompiler::Error::Seccomp(e) => e.raw_os_error().unwrap_or(libc::EINVAL),
                    _ => libc::EINVAL,
                });
            }
        }
        Ok(())
    }
}

/// Whether the kernel takes the filters and they refuse what they should: a forked child installs
/// them, then `unshare(CLONE_NEWUSER)` must fail with EPERM and `clone3` with ENOSYS.
pub(crate) fn probe() -> bool {
    let Ok(filters) = filters() else { return false };
    // SAFETY: the child makes raw syscalls only (apply allocates nothing on success), then _exit.
    unsafe {
        let pid = libc::fork();
        if pid < 0 {
            return false;
        }
        if pid == 0 {
            let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            let ok = filters.apply().is_ok()
                && libc::unshare(libc::CLONE_NEWUSER) != 0
                && errno() == libc::EPERM
                && libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize) != 0
                && errno() == libc::ENOSYS;
            libc::_exit(if ok { 0 } else { 1 });
        }
        crate::code::isolation::exited_zero(pid)
    }
}
