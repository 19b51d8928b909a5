/// What a registration's wait reported: the descriptor became ready, or it
/// can no longer be watched.
package struct ReadyEvent: Sendable, Hashable {
    /// The registration's token (`EventRegistry.register`).
    package var token: UInt64
    /// What the kernel reported, within the registration's interest plus
    /// `.error` and `.hangup`; empty when `failure` is set.
    package var readiness: Readiness
    /// Why the descriptor cannot be watched any more (closed: EBADF; the
    /// kernel refused: ENOMEM, ENOSPC, EPERM). The registration is disarmed
    /// and stays so; its owner should deregister it.
    package var failure: DescriptorWatchError?

    package init(token: UInt64, readiness: Readiness, failure: DescriptorWatchError? = nil) {
        self.token = token
        self.readiness = readiness
        self.failure = failure
    }
}
