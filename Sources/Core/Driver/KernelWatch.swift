/// The kernel watch an `EventRegistry` holds on one descriptor, as it hands
/// it back to the backend that made it.
package struct KernelWatch: Sendable, Hashable {
    /// The key the watch reports with: the descriptor in the low 32 bits, a
    /// generation in the high ones, so a report from an older watch of the
    /// same descriptor number is told apart.
    var key: UInt64
    /// Whether the watch has not reported yet (one-shot: after its report
    /// the kernel keeps it disabled, epoll, or gone, io_uring).
    var pending: Bool
}
