/// Which kernel interface an event backend sleeps in.
public enum EventBackendKind: String, Sendable, Hashable, CaseIterable {
    /// io_uring (liburing): one `io_uring_enter` submits pending polls and
    /// waits with a nanosecond timeout.
    case ioUring = "io_uring"
    /// epoll: `epoll_pwait2` with one-shot descriptor arming.
    case epoll
}
