import CShims

#if canImport(Glibc)
import Glibc
#endif

/// Backend selection.
public enum EventBackends {
    /// Creates a backend of `kind`, or of the preferred kind: the
    /// `SPINDLE_EVENT_BACKEND` environment variable (`io_uring` or `epoll`)
    /// if set, else io_uring when this process may use it, else epoll.
    /// Throws when the kernel refuses the kind asked for. With no kind asked
    /// for or forced, a ring the kernel refuses now (ENOMEM: the locked-memory
    /// limit; EMFILE) falls back to epoll before anything is thrown.
    package static func makeBackend(_ kind: EventBackendKind? = nil) throws(SystemCallError) -> any EventBackend {
        switch kind ?? preferredKind {
        case .ioUring:
            do {
                return try URingEventBackend()
            } catch {
                guard kind == nil, getenv("SPINDLE_EVENT_BACKEND") == nil else { throw error }
                return try EpollEventBackend()
            }
        case .epoll:
            return try EpollEventBackend()
        }
    }

    /// Why io_uring cannot be used by this process (EPERM under Docker's
    /// default seccomp profile or `kernel.io_uring_disabled`, ENOSYS on old
    /// kernels), or nil when it can. Probed once.
    public static let ioUringRefusal: SystemCallError? = {
        var error: Int32 = 0
        guard let ring = cshims_uring_create(4, 0, &error) else {
            return SystemCallError(call: "io_uring_setup", code: -error)
        }
        defer { cshims_uring_destroy(ring) }
        if cshims_uring_has_ext_arg(ring) == 0 {
            return SystemCallError(call: "io_uring_setup (IORING_FEAT_EXT_ARG missing, kernel < 5.11)", code: ENOSYS)
        }
        return nil
    }()

    /// The kind `makeBackend()` picks: `SPINDLE_EVENT_BACKEND` if set (an unknown
    /// value stops the process with a message), else io_uring unless refused.
    public static var preferredKind: EventBackendKind {
        if let forced = getenv("SPINDLE_EVENT_BACKEND") {
            let name = String(cString: forced)
            guard let kind = EventBackendKind(rawValue: name) else {
                misuse("SPINDLE_EVENT_BACKEND is '\(name)'; use 'io_uring' or 'epoll'")
            }
            return kind
        }
        return ioUringRefusal == nil ? .ioUring : .epoll
    }
}
