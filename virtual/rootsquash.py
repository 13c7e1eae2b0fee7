#!/usr/bin/python3
"""The simulated nodes' shared filesystem as an NFS export with root_squash (the default of every NFS server):
a FUSE passthrough of EXPORT at MOUNTPOINT that performs each request with the caller's uid and primary gid, root
mapped to nobody (65534:65534). The kernel checks every access against the export's real owners and modes, as the
NFS server would: root on a node (Ansible's become, a training container running as root) cannot write where
nobody may, cannot chown, and what it creates belongs to nobody; a non-root uid writes where it may.

Runs as root on the node (virtual/node-init.sh starts it before the node's dockerd, which bind-mounts MOUNTPOINT
into the training container), one request at a time: the filesystem uid/gid are per thread, switched around each
operation. Approximations of AUTH_SYS, named: the caller's supplementary groups are not sent (only its primary
gid), and locks are local to the node.

Usage: rootsquash.py EXPORT MOUNTPOINT  (Debian's python3-fusepy; /dev/fuse in the node)
"""

import ctypes
import errno
import os
import sys

from fusepy import FUSE, FuseOSError, Operations, fuse_get_context  # Debian's python3-fusepy

NOBODY = 65534
_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def squashed(uid, gid):
    """The credentials a request is performed with: root's mapped to nobody, every other uid as itself."""
    return (NOBODY, NOBODY) if uid == 0 else (uid, gid)


class RootSquash(Operations):
    def __init__(self, export):
        self.export = os.path.realpath(export)

    def _path(self, path):
        return os.path.join(self.export, path.lstrip("/"))

    def __call__(self, op, path, *args):
        uid, gid = squashed(*fuse_get_context()[:2])
        _libc.setfsgid(gid)
        _libc.setfsuid(uid)
        try:
            return getattr(self, op)(self._path(path) if isinstance(path, str) else path, *args)
        except OSError as exc:
            raise FuseOSError(exc.errno or errno.EIO) from None
        finally:
            _libc.setfsuid(0)
            _libc.setfsgid(0)

    # ---- metadata
    def getattr(self, path, fh=None):
        st = os.lstat(path)
        return {key: getattr(st, key) for key in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size",
                                                  "st_atime", "st_mtime", "st_ctime")}

    def access(self, path, mode):
        # the kernel's check under the caller's squashed fs ids (access(2) uses the real ids: faccessat with
        # AT_EACCESS uses the effective ones, which fsuid follows for file access)
        if not os.access(path, mode, effective_ids=True):
            raise FuseOSError(errno.EACCES)

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(path)

    def readlink(self, path):
        return os.readlink(path)

    def statfs(self, path):
        st = os.statvfs(path)
        return {key: getattr(st, key) for key in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                                  "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

    def chmod(self, path, mode):
        os.chmod(path, mode)

    def chown(self, path, uid, gid):
        os.lchown(path, uid, gid)

    def utimens(self, path, times=None):
        os.utime(path, times, follow_symlinks=False)

    # ---- names
    def mkdir(self, path, mode):
        os.mkdir(path, mode)

    def rmdir(self, path):
        os.rmdir(path)

    def unlink(self, path):
        os.unlink(path)

    def symlink(self, target, source):
        os.symlink(source, target)

    def link(self, target, source):
        os.link(self._path(source), target)

    def rename(self, old, new):
        os.rename(old, self._path(new))

    # ---- data
    def open(self, path, flags):
        return os.open(path, flags)

    def create(self, path, mode, fi=None):
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

    def read(self, path, size, offset, fh):
        return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        return os.pwrite(fh, data, offset)

    def truncate(self, path, length, fh=None):
        if fh is None:
            os.truncate(path, length)
        else:
            os.ftruncate(fh, length)

    def flush(self, path, fh):
        return 0

    def fsync(self, path, datasync, fh):
        os.fdatasync(fh) if datasync else os.fsync(fh)

    def release(self, path, fh):
        os.close(fh)


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__.rstrip().splitlines()[-1])
    os.umask(0)  # the kernel applied the caller's umask already
    os.setgroups([])  # root's groups must not grant nobody anything
    FUSE(RootSquash(argv[1]), argv[2], foreground=True, nothreads=True, allow_other=True, fsname="rootsquash",
         big_writes=True, max_read=1048576, max_write=1048576)


if __name__ == "__main__":
    main(sys.argv)
