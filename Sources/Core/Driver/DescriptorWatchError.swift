#if canImport(Glibc)
import Glibc
#endif

/// A descriptor that cannot be watched for readiness, and why.
public struct DescriptorWatchError: Error, Sendable, Hashable, CustomStringConvertible {
    /// Why the descriptor cannot be watched.
    public enum Reason: Sendable, Hashable {
        /// The descriptor is not open (EBADF): never opened, or closed while
        /// a source still watched it.
        case notOpen
        /// A regular file or a directory: always ready to read and write, so
        /// there is nothing to wait for (epoll refuses them with EPERM).
        case alwaysReady
        /// The kernel refused the watch (ENOMEM, ENOSPC: the
        /// `max_user_watches` limit; EPERM).
        case kernelRefused
    }

    /// The descriptor.
    public let descriptor: Int32
    /// Why it cannot be watched.
    public let reason: Reason
    /// The errno the kernel gave (positive).
    public let code: Int32

    /// The failure of watching `descriptor` for `reason`, with errno `code`.
    public init(descriptor: Int32, reason: Reason, code: Int32) {
        self.descriptor = descriptor
        self.reason = reason
        self.code = code
    }

    public var description: String {
        let why = switch reason {
        case .notOpen: "it is not an open descriptor"
        case .alwaysReady: "it is a regular file or directory, which is always ready and cannot be waited on"
        case .kernelRefused: "the kernel refused to watch it"
        }
        return "cannot watch descriptor \(descriptor): \(why) (\(errnoDescription(code)))"
    }

}
