#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A system call that the environment refused: a permission, a resource
/// limit, a kernel feature switched off. Spindle throws these; it stops the
/// process only for failures that mean a bug in Spindle or its caller.
public struct SystemCallError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The call that failed, e.g. `"io_uring_setup"`.
    public let call: String
    /// The `errno` value it reported (positive).
    public let code: Int32

    /// The failure of `call` with errno `code`.
    public init(call: String, code: Int32) {
        self.call = call
        self.code = code
    }

    public var description: String {
        "\(call) failed: \(errnoDescription(code))"
    }
}

/// `"EPERM (Operation not permitted)"`.
internal func errnoDescription(_ code: Int32) -> String {
    let name = errnoNames[code] ?? "errno \(code)"
    guard let text = strerror(code) else { return name }
    return "\(name) (\(String(cString: text)))"
}

/// Names for the errno values Spindle's calls can report.
private let errnoNames: [Int32: String] = [
    EPERM: "EPERM", ENOENT: "ENOENT", ESRCH: "ESRCH", EINTR: "EINTR", EIO: "EIO",
    EBADF: "EBADF", EAGAIN: "EAGAIN", ENOMEM: "ENOMEM", EACCES: "EACCES",
    EFAULT: "EFAULT", EBUSY: "EBUSY", EEXIST: "EEXIST", ENOTDIR: "ENOTDIR",
    EISDIR: "EISDIR", EINVAL: "EINVAL", ENFILE: "ENFILE", EMFILE: "EMFILE",
    ENOSPC: "ENOSPC", EROFS: "EROFS", ERANGE: "ERANGE", EDEADLK: "EDEADLK",
    ENOSYS: "ENOSYS", ELOOP: "ELOOP", ETIMEDOUT: "ETIMEDOUT", ETIME: "ETIME",
    EOPNOTSUPP: "EOPNOTSUPP", ECANCELED: "ECANCELED", EOWNERDEAD: "EOWNERDEAD",
    ENAMETOOLONG: "ENAMETOOLONG", EDQUOT: "EDQUOT", EXDEV: "EXDEV", EMLINK: "EMLINK", ESTALE: "ESTALE",
    ENXIO: "ENXIO", EPIPE: "EPIPE", ENOBUFS: "ENOBUFS", ENOTSOCK: "ENOTSOCK", EPROTO: "EPROTO",
    EADDRINUSE: "EADDRINUSE", EADDRNOTAVAIL: "EADDRNOTAVAIL", ENETDOWN: "ENETDOWN", ENETUNREACH: "ENETUNREACH",
    ECONNABORTED: "ECONNABORTED", ECONNRESET: "ECONNRESET", ENOTCONN: "ENOTCONN", ECONNREFUSED: "ECONNREFUSED",
    EHOSTDOWN: "EHOSTDOWN", EHOSTUNREACH: "EHOSTUNREACH", EINPROGRESS: "EINPROGRESS", EALREADY: "EALREADY",
]
