# coa-tools sandbox prelude, run as `python3 -s -B -c <this> main.py` in the sandbox dir.
# Defence in depth, NOT a security boundary (ctypes, subprocesses or dir_fd tricks get past it):
# the boundary is the unprivileged user, the rlimits and the process group kill. An audit hook
# refuses writes outside the working directory, mainly because /tmp stays world-writable.
# Everything lives inside one function that deletes itself, so __main__ starts clean.


def _coa_run():
    import linecache, os, sys
    realpath, isabs, join, fsdecode, getcwd, readlink = (
        os.path.realpath, os.path.isabs, os.path.join, os.fsdecode, os.getcwd, os.readlink)
    root = realpath(getcwd())
    prefix = root + os.sep
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def inside(path, dir_fd):
        if isinstance(path, int):  # an fd the code already holds
            return True
        path = fsdecode(path)
        if not isabs(path):
            base = getcwd() if dir_fd is None or dir_fd < 0 else readlink('/proc/self/fd/%d' % dir_fd)
            path = join(base, path)
        path = realpath(path)
        return path == root or path.startswith(prefix)

    # audit event -> ((path arg, dir_fd arg or None), ...) of the paths it modifies
    checks = {
        'open': ((0, None),), 'os.remove': ((0, 1),), 'os.rmdir': ((0, 1),),
        'os.mkdir': ((0, 2),), 'os.rename': ((0, 2), (1, 3)), 'os.link': ((0, 2), (1, 3)),
        'os.symlink': ((1, 2),), 'os.truncate': ((0, None),), 'os.chmod': ((0, 2),),
        'os.chown': ((0, 3),), 'os.utime': ((0, 3),), 'os.setxattr': ((0, None),),
        'os.removexattr': ((0, None),), 'shutil.rmtree': ((0, 1),),
    }

    def hook(event, args):
        spec = checks.get(event)
        if spec is None or (event == 'open' and not (args[2] or 0) & writes):
            return
        for p, d in spec:
            if not inside(args[p], None if d is None else args[d]):
                raise PermissionError(13, 'sandbox: writing outside the working directory is not allowed', fsdecode(args[p]))

    sys.addaudithook(hook)

    # Run main.py as `python3 main.py` would: as __main__, with argv and path[0] to match.
    # The fixed relative file name keeps tracebacks identical from run to run.
    name = sys.argv[1]
    with open(name, encoding='utf-8') as f:
        source = f.read()
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    sys.argv = sys.argv[1:]
    sys.path.insert(0, root)
    main = sys.modules['__main__'].__dict__
    del main['_coa_run']
    main['__file__'] = name
    try:
        exec(compile(source, name, 'exec'), main)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:
        # Report as the interpreter would, minus this prelude's frame.
        e.__traceback__ = e.__traceback__.tb_next
        sys.excepthook(type(e), e, e.__traceback__)
        sys.exit(1)


_coa_run()
