/// The kernel calls of one event interface, and nothing else: which
/// descriptors are registered, for what, and what happens after a report is
/// the `EventRegistry`'s business. A backend watches each descriptor at most
/// once, one-shot, for the union of its registrations' interests.
///
/// `watch`, `unwatch` and `enterKernel` are called only by the registry's
/// owner thread, with the registry's lock held for the first two;
/// `signalWaker()` from any thread.
package protocol EventBackend: AnyObject, Sendable {
    /// Which kernel interface this backend uses.
    var kind: EventBackendKind { get }

    /// Watches `fd` once for `interest`, to report with `key`, replacing
    /// `current` (the registry's last watch of this descriptor, if it has
    /// not removed it). Returns 0 or -errno (EBADF: the descriptor is
    /// closed; ENOMEM, ENOSPC: the kernel refused).
    func watch(_ fd: Int32, for interest: Readiness, key: UInt64, replacing current: KernelWatch?) -> Int32

    /// Removes the watch `current` of `fd`. A descriptor already closed has
    /// lost its watch with it; that is not an error.
    func unwatch(_ fd: Int32, current: KernelWatch)

    /// Whether watches were changed without the kernel having been told yet
    /// (io_uring queues them for the next `enterKernel`).
    var hasUnsubmittedChanges: Bool { get }

    /// Hands queued changes to the kernel and waits at most
    /// `timeoutNanoseconds` (negative: no limit; 0: only collects) for a
    /// watch to report or the waker to fire. Appends the watches' reports to
    /// `completions`, consumes the waker's, and returns 0 and whether the
    /// waker fired, or -errno of the wait itself (-EINTR: a signal arrived;
    /// the registry retries).
    func enterKernel(timeoutNanoseconds: Int64, completions: inout [KernelCompletion]) -> (rc: Int32, woken: Bool)

    /// Makes the waker fire (an eventfd write), waking `enterKernel`. Any
    /// thread; never blocks.
    func signalWaker()
}
