/// Why an event source could not be made, or stopped.
public enum EventSourceError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The descriptor is not open.
    case descriptorNotOpen(Int32)
    /// The signal cannot be observed; `reason` says why.
    case signalNotObservable(Int32, reason: String)
    /// Linux cannot report these events of another process without
    /// privileges (see `EventSource.ProcessEvents`).
    case processEventsNotObservable(EventSource.ProcessEvents)
    /// There is no process with this id (it may have exited and been reaped).
    case noSuchProcess(Int32)
    /// The descriptor could not be watched for readiness (it was closed
    /// while watched, or the kernel refused).
    case watchFailed(DescriptorWatchError)
    /// A system call failed.
    case systemCall(SystemCallError)

    public var description: String {
        switch self {
        case .descriptorNotOpen(let fd):
            "descriptor \(fd) is not open"
        case .signalNotObservable(let signal, let reason):
            "signal \(signal) cannot be observed: \(reason)"
        case .processEventsNotObservable(let events):
            "process events \(events) cannot be observed: Linux reports only `exit` to an unprivileged process (fork, exec and signal need CAP_NET_ADMIN or ptrace)"
        case .noSuchProcess(let pid):
            "there is no process \(pid)"
        case .watchFailed(let error):
            error.description
        case .systemCall(let error):
            error.description
        }
    }
}
