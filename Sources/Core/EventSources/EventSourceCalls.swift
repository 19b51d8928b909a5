import CShims

#if canImport(Glibc)
import Glibc
#endif

/// The event sources' system calls, with errno sorted in one place: EINTR
/// and EAGAIN are retried or mean "nothing now" in C; what the environment
/// refuses (limits, permissions, an old kernel) throws; EBADF and EFAULT on
/// a descriptor Spindle owns, or EINVAL on arguments Spindle built, are bugs
/// in Spindle and stop with a message naming the call.
enum EventSourceCalls {
    static let regularFile = UInt32(CSHIMS_FD_REGULAR)
    static let directory = UInt32(CSHIMS_FD_DIRECTORY)

    struct Stat {
        var type: UInt32
        var size: Int64
        var links: UInt64
    }

    /// fstat(2) of a caller's descriptor.
    static func stat(_ fd: Int32) throws(EventSourceError) -> Stat {
        var stat = Stat(type: 0, size: 0, links: 0)
        let rc = cshims_fd_stat(fd, &stat.type, &stat.size, &stat.links)
        if rc == -EBADF { throw .descriptorNotOpen(fd) }
        if rc < 0 { throw .systemCall(SystemCallError(call: "fstat", code: -rc)) }
        return stat
    }

    /// Bytes readable on `fd` (FIONREAD), or nil where the kernel cannot
    /// tell (a listening socket, an eventfd, a closed descriptor).
    static func readableBytes(_ fd: Int32) -> Int64? {
        let n = cshims_fd_readable_bytes(fd)
        return n < 0 ? nil : n
    }

    /// Space for a write on a socket or pipe; nil for other kinds.
    static func writeSpace(_ fd: Int32, type: UInt32) -> Int64? {
        let n = cshims_fd_write_space(fd, type)
        return n < 0 ? nil : n
    }

    /// Whether `fd` is readable (or hung up) right now; false on error.
    static func isReadableNow(_ fd: Int32) -> Bool { cshims_fd_readable_now(fd) == 1 }

    static func offset(_ fd: Int32) -> Int64? {
        let n = cshims_fd_offset(fd)
        return n < 0 ? nil : n
    }

    static func pidfdOpen(_ pid: Int32) throws(EventSourceError) -> Int32 {
        let rc = cshims_pidfd_open(pid)
        if rc >= 0 { return rc }
        if rc == -ESRCH { throw .noSuchProcess(pid) }
        if rc == -EINVAL { throw .noSuchProcess(pid) } // pid <= 0
        throw .systemCall(SystemCallError(call: "pidfd_open", code: -rc))
    }

    /// How the child behind `pidfd` ended, without reaping it; nil if it
    /// has not ended or is not our child.
    static func exitStatus(pidfd: Int32) -> EventSource.ExitStatus? {
        var code: Int32 = 0
        var how: Int32 = 0
        let rc = cshims_pidfd_exit_status(pidfd, &code, &how)
        if rc == -EBADF || rc == -EFAULT { misuse("waitid(P_PIDFD) failed on Spindle's own pidfd \(pidfd): \(errnoDescription(-rc))") }
        guard rc == 1 else { return nil }
        return how == 1 ? .exited(code) : .signaled(code, coreDumped: how == 3)
    }

    static func close(_ fd: Int32) {
        let rc = cshims_close(fd)
        if rc == -EBADF { misuse("close(\(fd)) of Spindle's own descriptor: EBADF (closed twice?)") }
    }

    static func eventfd() throws(EventSourceError) -> Int32 {
        let fd = cshims_eventfd_create()
        if fd < 0 { throw .systemCall(SystemCallError(call: "eventfd", code: -fd)) }
        return fd
    }

    /// Makes one of Spindle's signal eventfds readable (a signal's count
    /// brought to a new place by a move, to be handed over there now).
    static func pokeEventfd(_ fd: Int32) {
        guard fd >= 0 else { return }
        let rc = cshims_eventfd_signal(fd)
        if rc < 0 && rc != -EAGAIN { misuse("write of Spindle's signal eventfd \(fd) failed: \(errnoDescription(-rc))") }
    }

    static func drainEventfd(_ fd: Int32) {
        let rc = cshims_eventfd_drain(fd)
        if rc < 0 { misuse("read of Spindle's signal eventfd \(fd) failed: \(errnoDescription(-rc))") }
    }

    static func installSignalObserver(_ signal: Int32) throws(EventSourceError) {
        let rc = cshims_signal_watch_install(signal)
        if rc < 0 { throw .systemCall(SystemCallError(call: "sigaction", code: -rc)) }
    }

    /// Has every signal observer write `eventfd` (-1: nothing) in `slot`.
    static func setSignalEventfd(slot: Int32, _ eventfd: Int32) {
        let rc = cshims_signal_watch_set_eventfd(slot, eventfd)
        if rc < 0 { misuse("signal observer slot \(slot) is out of range") }
    }

    static func restoreSignal(_ signal: Int32) {
        let rc = cshims_signal_watch_restore(signal)
        if rc < 0 { misuse("sigaction(\(signal)) failed restoring the saved disposition: \(errnoDescription(-rc))") }
    }

    static func signalCount(_ signal: Int32) -> UInt64 { cshims_signal_watch_count(signal) }

    static func inotify() throws(EventSourceError) -> Int32 {
        let fd = cshims_inotify_create()
        if fd < 0 { throw .systemCall(SystemCallError(call: "inotify_init1", code: -fd)) }
        return fd
    }

    static func inotifyWatch(_ ifd: Int32, descriptor fd: Int32, mask: UInt32) throws(EventSourceError) -> Int32 {
        let wd = cshims_inotify_watch_descriptor(ifd, fd, mask)
        if wd >= 0 { return wd }
        if wd == -ENOENT || wd == -EBADF { throw .descriptorNotOpen(fd) }
        throw .systemCall(SystemCallError(call: "inotify_add_watch", code: -wd))
    }

    /// Removes a watch; one the kernel already dropped (the file was
    /// deleted, its file system unmounted) is not an error.
    static func inotifyUnwatch(_ ifd: Int32, _ wd: Int32) {
        let rc = cshims_inotify_unwatch(ifd, wd)
        if rc < 0 && rc != -EINVAL { misuse("inotify_rm_watch(\(wd)) failed: \(errnoDescription(-rc))") }
    }

    /// Reads queued inotify events into `wds`/`masks` (256 each); returns
    /// how many, and whether more may be queued (false: the read took all
    /// there was, and reading again would only find the queue empty).
    static func inotifyRead(_ ifd: Int32, _ wds: inout [Int32], _ masks: inout [UInt32]) -> (count: Int, more: Bool) {
        var more: Int32 = 0
        let n = wds.withUnsafeMutableBufferPointer { w in
            masks.withUnsafeMutableBufferPointer { m in
                cshims_inotify_read(ifd, w.baseAddress, m.baseAddress, Int32(min(w.count, m.count)), &more)
            }
        }
        if n < 0 { misuse("read of Spindle's inotify descriptor failed: \(errnoDescription(-n))") }
        return (Int(n), more != 0)
    }

    /// The timerfd that tells of wall-clock changes (disarmed).
    static func clockChangeTimer() throws(EventSourceError) -> Int32 {
        let fd = cshims_clock_change_create()
        if fd < 0 { throw .systemCall(SystemCallError(call: "timerfd_create(CLOCK_REALTIME)", code: -fd)) }
        return fd
    }

    /// Arms the clock-change timerfd. A setting of the clock since it was
    /// last armed or read makes the kernel refuse (`ECANCELED`), consuming
    /// that notice; it is then armed again, which fails again only if the
    /// clock was set again in between.
    static func armClockChange(_ fd: Int32) {
        while true {
            let rc = cshims_clock_change_arm(fd)
            if rc == 0 { return }
            if rc != -ECANCELED { misuse("timerfd_settime of Spindle's clock-change timer \(fd) failed: \(errnoDescription(-rc))") }
        }
    }

    static func disarmClockChange(_ fd: Int32) {
        let rc = cshims_clock_change_disarm(fd)
        if rc < 0 { misuse("timerfd_settime of Spindle's clock-change timer \(fd) failed: \(errnoDescription(-rc))") }
    }

    /// Whether the clock-change timerfd says the clock was set (the notice
    /// is consumed: arm it again).
    static func clockChangeFired(_ fd: Int32) -> Bool {
        let rc = cshims_clock_change_read(fd)
        if rc == -ECANCELED { return true }
        if rc < 0 { misuse("read of Spindle's clock-change timer \(fd) failed: \(errnoDescription(-rc))") }
        return false
    }
}
