//! Output files that appear whole or not at all, and all of a stage's outputs together.
//!
//! - [`check_output_path`] / [`check_outputs`]: a stage checks every output path it was given
//!   (`-o`, `--stats`, `--report`, `--corpus-out`, ...) before it starts working, so a path naming
//!   a directory, or a directory that cannot hold the file, fails at once instead of after the work.
//! - [`TempFile`]: a file under a temporary name (`.NAME.PID.tmp`) beside its destination, whose
//!   missing parent directories are created on demand. Dropped uncommitted, it removes the file and
//!   the directories it created; on SIGTERM/SIGINT/SIGHUP the same happens (see [`crate::cleanup`]).
//! - Commits are deferred while a stage runs ([`defer_commits`], done by `stage::run`): a finished
//!   output waits under its temporary name until the stage succeeds, then every output is renamed
//!   into place ([`commit_deferred`]); a failing stage discards them all ([`discard_deferred`]).
//!   Without deferral (tests, library use) a commit renames at once.
//! - [`AtomicFile`]: a buffered writer over a [`TempFile`] (or, for a device or FIFO such as
//!   `/dev/null`, over the path itself), and [`write_atomically`] for a small file in one go.
//! - [`write_atomically_now`] and [`write_dir_atomically`]: a file, or a whole directory (a model
//!   checkpoint), moved into place as soon as it is written, outside the stage's deferral.
//!
//! Every file the workspace writes atomically goes through this module (the one exception: the
//! OpenAI backend's response cache, shared by concurrent writers, uses uniquely named temp files).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

use anyhow::{anyhow, bail, Context, Result};

use crate::cleanup;

/// Whether `path` means stdout (`-`).
pub fn is_stdout(path: &Path) -> bool {
    path == Path::new("-")
}

/// Whether `path` exists and is something written in place: a device or a FIFO (`/dev/null`,
/// `/dev/stdout`, a named pipe). Renaming a temporary file onto it would replace the device.
pub fn is_written_in_place(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| !m.file_type().is_file() && !m.is_dir())
}

/// Checks that `path` can name an output file of flag `flag`, before any work is done: not a
/// directory (existing, or spelled with a trailing `/`), not a root or `..`, and its parent
/// either a writable directory or missing (created when the file is written), never a file.
pub fn check_output_path(flag: &str, path: &Path) -> Result<()> {
    if is_stdout(path) {
        return Ok(());
    }
    let shown = path.display();
    if path.as_os_str().is_empty() {
        bail!("{flag}: the output path is empty; expected a file name");
    }
    if path.as_os_str().as_encoded_bytes().ends_with(b"/") || path.file_name().is_none() || matches!(path.components().next_back(), Some(Component::ParentDir | Component::CurDir)) {
        bail!("{flag} {shown}: names a directory; expected a file name (e.g. {}/out.parquet)", shown.to_string().trim_end_matches('/'));
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => bail!("{flag} {shown}: is a directory; expected a file name (e.g. {}/out.parquet)", shown),
        Ok(_) if is_written_in_place(path) => return Ok(()),
        _ => {}
    }
    // The nearest existing ancestor must be a directory we may create entries in.
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut ancestor = parent;
    loop {
        match std::fs::metadata(ancestor) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => bail!("{flag} {shown}: {} is not a directory", ancestor.display()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => match ancestor.parent().filter(|p| !p.as_os_str().is_empty()) {
                Some(up) => ancestor = up,
                None => break,
            },
            Err(e) => bail!("{flag} {shown}: cannot inspect {}: {e}", ancestor.display()),
        }
    }
    if std::fs::metadata(ancestor).is_ok() && !may_create_in(ancestor) {
        bail!("{flag} {shown}: cannot create files in {} (permission denied or read-only)", ancestor.display());
    }
    Ok(())
}

/// Whether this process may create entries in directory `dir` (write + search permission, and a
/// writable file system).
fn may_create_in(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return false };
    // SAFETY: access(2) on a NUL-terminated path.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

/// [`check_output_path`] for every given output, and no two outputs naming the same file.
pub fn check_outputs(outputs: &[(&str, Option<&Path>)]) -> Result<()> {
    let mut seen: Vec<(&str, PathBuf)> = Vec::new();
    for &(flag, path) in outputs {
        let Some(path) = path else { continue };
        check_output_path(flag, path)?;
        if is_stdout(path) || is_written_in_place(path) {
            continue;
        }
        let key = normalize(path);
        if let Some((other, _)) = seen.iter().find(|(_, k)| *k == key) {
            bail!("{flag} {}: the same file as {other}; give each output its own file", path.display());
        }
        seen.push((flag, key));
    }
    Ok(())
}

/// `path` made absolute with `.` and `..` resolved lexically (outputs may not exist yet).
fn normalize(path: &Path) -> PathBuf {
    let abs = if path.is_absolute() { path.to_path_buf() } else { std::env::current_dir().unwrap_or_default().join(path) };
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// A file under a temporary name beside `path`, renamed onto `path` by [`TempFile::commit`].
pub struct TempFile {
    tmp: PathBuf,
    path: PathBuf,
    /// Directories created for it, outermost first: removed again if it is never committed.
    created_dirs: Vec<PathBuf>,
    committed: bool,
    _on_signal: cleanup::Guard,
}

impl TempFile {
    /// Creates `.NAME.PID.tmp` beside `path` (and `path`'s missing parent directories).
    pub fn create(path: &Path) -> Result<(TempFile, File)> {
        Self::create_named(path, false)
    }

    /// Like [`TempFile::create`] with the temporary name ending in `path`'s extension
    /// (`.NAME.PID.tmp.png`), for writers that pick the format from it.
    pub fn create_keeping_extension(path: &Path) -> Result<(TempFile, File)> {
        Self::create_named(path, true)
    }

    fn create_named(path: &Path, keep_extension: bool) -> Result<(TempFile, File)> {
        check_output_path("output", path)?;
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let pid = std::process::id();
        let tmp_name = match path.extension().filter(|_| keep_extension) {
            Some(ext) => format!(".{name}.{pid}.tmp.{}", ext.to_string_lossy()),
            None => format!(".{name}.{pid}.tmp"),
        };
        let tmp = path.with_file_name(tmp_name);
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        let missing: Vec<PathBuf> = parent.map(|p| p.ancestors().take_while(|a| !a.as_os_str().is_empty() && !a.exists()).map(Path::to_path_buf).collect()).unwrap_or_default();
        let created_dirs: Vec<PathBuf> = missing.into_iter().rev().collect();
        // Registered before anything is created: once a signal's cleanup has started, this blocks.
        let on_signal = {
            let (tmp, dirs) = (tmp.clone(), created_dirs.clone());
            cleanup::on_signal(move || remove_traces(&tmp, &dirs))
        };
        let file = TempFile { tmp, path: path.to_path_buf(), created_dirs, committed: false, _on_signal: on_signal };
        for dir in &file.created_dirs {
            if let Err(e) = std::fs::create_dir(dir) {
                if e.kind() != io::ErrorKind::AlreadyExists {
                    return Err(anyhow!(e).context(format!("creating output directory {}", dir.display())));
                }
            }
        }
        let f = File::create(&file.tmp).with_context(|| format!("creating {}", file.tmp.display()))?;
        Ok((file, f))
    }

    /// The temporary name being written.
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// The destination.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves the file into place: now, or when the stage succeeds if commits are deferred.
    pub fn commit(self) -> Result<()> {
        let mut deferred = DEFERRED.lock().unwrap_or_else(|e| e.into_inner());
        match deferred.as_mut() {
            Some(queue) => {
                queue.push(self);
                Ok(())
            }
            None => {
                drop(deferred);
                self.rename_into_place()
            }
        }
    }

    fn rename_into_place(mut self) -> Result<()> {
        if std::fs::metadata(&self.path).is_ok_and(|m| m.is_dir()) {
            bail!("{}: is a directory; cannot write the output there", self.path.display());
        }
        std::fs::rename(&self.tmp, &self.path).with_context(|| format!("renaming {} to {}", self.tmp.display(), self.path.display()))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.committed {
            remove_traces(&self.tmp, &self.created_dirs);
        }
    }
}

/// Removes a temporary file and then the directories created for it (innermost first, only
/// while empty).
fn remove_traces(tmp: &Path, created_dirs: &[PathBuf]) {
    let _ = std::fs::remove_file(tmp);
    for dir in created_dirs.iter().rev() {
        let _ = std::fs::remove_dir(dir);
    }
}

/// Finished outputs waiting for the stage to succeed; `None` when commits are immediate.
static DEFERRED: Mutex<Option<Vec<TempFile>>> = Mutex::new(None);

/// From now on, [`TempFile::commit`] queues instead of renaming (see the module docs).
pub fn defer_commits() {
    let mut d = DEFERRED.lock().unwrap_or_else(|e| e.into_inner());
    d.get_or_insert_with(Vec::new);
}

/// Renames every queued output into place, in the order they were committed, and ends the
/// deferral. Every destination is checked first, so a failure renames none of them.
pub fn commit_deferred() -> Result<()> {
    let queue = DEFERRED.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_default();
    for f in &queue {
        if std::fs::metadata(&f.path).is_ok_and(|m| m.is_dir()) {
            bail!("{}: became a directory while the stage ran; no output was written", f.path.display());
        }
    }
    for f in queue {
        f.rename_into_place()?;
    }
    Ok(())
}

/// Drops every queued output (their temporary files are removed) and ends the deferral.
pub fn discard_deferred() {
    let queue = DEFERRED.lock().unwrap_or_else(|e| e.into_inner()).take();
    drop(queue);
}

/// A buffered output file: a [`TempFile`] committed by [`AtomicFile::finish`], or a device or
/// FIFO written in place. Dropped unfinished, nothing is left.
pub struct AtomicFile {
    out: Option<BufWriter<File>>,
    /// `None` when writing a device or FIFO in place.
    tmp: Option<TempFile>,
    path: PathBuf,
}

impl AtomicFile {
    pub fn create(path: &Path) -> Result<AtomicFile> {
        if is_written_in_place(path) {
            let f = std::fs::OpenOptions::new().write(true).open(path).with_context(|| format!("opening {}", path.display()))?;
            return Ok(AtomicFile { out: Some(BufWriter::with_capacity(1 << 20, f)), tmp: None, path: path.to_path_buf() });
        }
        let (tmp, f) = TempFile::create(path)?;
        Ok(AtomicFile { out: Some(BufWriter::with_capacity(1 << 20, f)), tmp: Some(tmp), path: path.to_path_buf() })
    }

    pub fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        let out = self.out.as_mut().ok_or_else(|| anyhow!("{} already finished", self.path.display()))?;
        out.write_all(bytes).with_context(|| format!("writing {}", self.path.display()))
    }

    /// Flushes, syncs and commits.
    pub fn finish(mut self) -> Result<()> {
        let out = self.out.take().ok_or_else(|| anyhow!("{} already finished", self.path.display()))?;
        let f = out.into_inner().map_err(|e| e.into_error()).with_context(|| format!("writing {}", self.path.display()))?;
        let Some(tmp) = self.tmp.take() else { return Ok(()) };
        f.sync_all().with_context(|| format!("writing {}", self.path.display()))?;
        tmp.commit()
    }
}

/// Writes a small file whole (temporary name, committed as [`TempFile::commit`] says); a device
/// or FIFO (`--stats /dev/stderr`) is written in place.
pub fn write_atomically(path: &Path, contents: &[u8]) -> Result<()> {
    let mut f = AtomicFile::create(path)?;
    f.write_all(contents)?;
    f.finish()
}

/// Writes a file whole under a temporary name and renames it into place at once, even while a
/// stage defers its commits: for files inside a directory that is itself moved into place when
/// complete ([`write_dir_atomically`], a checkpoint), whose rename cannot wait for the stage's end.
pub fn write_atomically_now(path: &Path, contents: &[u8]) -> Result<()> {
    let (tmp, mut f) = TempFile::create(path)?;
    f.write_all(contents).with_context(|| format!("writing {}", tmp.tmp_path().display()))?;
    drop(f);
    tmp.rename_into_place()
}

/// Writes a cache entry whole: a temporary file of its own beside `path` (process, counter and
/// clock in its name, so concurrent writers of the same entry, threads or processes, never share
/// one), renamed into place. Every writer of an entry writes the same bytes, so whichever rename
/// lands last is right; a failed write leaves nothing behind. For caches, not stage outputs:
/// the kernels' compiled PTX, the emulated device's library, the teacher's HTTP responses.
pub fn write_cache_entry(path: &Path, contents: &[u8]) -> io::Result<()> {
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.{n}.{nanos}.tmp", std::process::id()));
    let written = std::fs::write(&tmp, contents).and_then(|_| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Writes a directory whole: `fill` writes the files into a fresh temporary directory beside
/// `dir` (`.NAME.tmp-PID`), which then replaces `dir` (an old `dir` is moved aside to
/// `.NAME.old-PID` meanwhile, and put back if anything fails). It is committed at once, not with
/// the stage's other outputs; on SIGTERM/SIGINT/SIGHUP the temporary directory is removed.
pub fn write_dir_atomically(dir: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "checkpoint".into());
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    let old = parent.join(format!(".{name}.old-{}", std::process::id()));
    let _on_signal = {
        let (tmp, old, dir) = (tmp.clone(), old.clone(), dir.to_path_buf());
        cleanup::on_signal(move || {
            let _ = std::fs::remove_dir_all(&tmp);
            if old.exists() && !dir.exists() {
                let _ = std::fs::rename(&old, &dir);
            }
        })
    };
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let result = fill(&tmp).and_then(|_| {
        if dir.exists() {
            std::fs::rename(dir, &old).with_context(|| format!("moving the old {} aside", dir.display()))?;
        }
        std::fs::rename(&tmp, dir).with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))?;
        let _ = std::fs::remove_dir_all(&old);
        Ok(())
    });
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
        if old.exists() && !dir.exists() {
            let _ = std::fs::rename(&old, dir);
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_are_refused_as_output_files() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let e = check_output_path("-o", d).unwrap_err().to_string();
        assert!(e.contains("-o") && e.contains("is a directory"), "{e}");
        let e = check_output_path("--report", &d.join("new/")).unwrap_err().to_string();
        assert!(e.contains("names a directory"), "{e}");
        let e = check_output_path("-o", &d.join("..")).unwrap_err().to_string();
        assert!(e.contains("names a directory"), "{e}");
        check_output_path("-o", &d.join("a/b/out.parquet")).unwrap();
        std::fs::write(d.join("file"), "x").unwrap();
        let e = check_output_path("-o", &d.join("file/out.parquet")).unwrap_err().to_string();
        assert!(e.contains("is not a directory"), "{e}");
        check_output_path("-o", Path::new("/dev/null")).unwrap();
        check_output_path("-o", Path::new("-")).unwrap();
    }

    #[test]
    fn two_outputs_may_not_share_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.parquet");
        let b = dir.path().join("x/../a.parquet");
        let e = check_outputs(&[("-o", Some(&a)), ("--stats", None), ("--report", Some(&b))]).unwrap_err().to_string();
        assert!(e.contains("--report") && e.contains("same file as -o"), "{e}");
        check_outputs(&[("-o", Some(Path::new("/dev/null"))), ("--stats", Some(Path::new("/dev/null")))]).unwrap();
    }

    #[test]
    fn an_uncommitted_file_leaves_nothing_not_even_its_directories() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("new/deeper/out.bin");
        let (tmp, mut f) = TempFile::create(&target).unwrap();
        f.write_all(b"data").unwrap();
        assert!(tmp.tmp_path().exists());
        drop(tmp);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "created directories stay");
        let (tmp, mut f) = TempFile::create(&target).unwrap();
        f.write_all(b"data").unwrap();
        tmp.commit().unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"data");
        let names: Vec<_> = std::fs::read_dir(target.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("out.bin")]);
    }

    #[test]
    fn the_extension_can_be_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (tmp, _f) = TempFile::create_keeping_extension(&dir.path().join("loss.png")).unwrap();
        assert_eq!(tmp.tmp_path().extension().unwrap(), "png");
    }
}
