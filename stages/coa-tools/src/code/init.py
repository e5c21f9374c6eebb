# The init of a run's namespaces (pid 1), exec'd fresh by the forked one so that nothing of the
# stage (its memory, arguments, environment) stays in the run: it reaps every process of the
# namespace until the program (argv[1]) exits, writes the program's wait status on the status
# pipe (argv[2]) as the 12-byte record the stage reads (kind argv[3], status, 0), and exits; the
# kernel then kills whatever is left in the namespace.
import os
import sys

program, fd, kind = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
while True:
    try:
        pid, status = os.waitpid(-1, 0)
    except ChildProcessError:
        os._exit(127)
    if pid == program:
        order = sys.byteorder
        os.write(fd, kind.to_bytes(4, order) + status.to_bytes(4, order, signed=True) + bytes(4))
        os._exit(0)
