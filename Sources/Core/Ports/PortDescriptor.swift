import Synchronization

/// One socket of a listening port (`NamedPort`, `NetworkPort`): its
/// listener or a connection. The port's loop thread reads, writes and
/// accepts on it, while any thread may close it (`invalidate()`), and a
/// descriptor closed under a thread that is still using it is worse than
/// an error: the kernel hands its number to the next `accept`, `socket` or
/// `open` of any thread in the process, and the late call lands on that
/// file. Users hold the socket open for the span of their calls (`use`);
/// `close` shuts it down at once, so the peer sees the end and a call in
/// progress returns, and the descriptor itself closes when the last user
/// leaves: at once if there is none, as `RemotePort` does for its
/// requesters.
///
/// Rule for the ports: code that calls the kernel with the descriptor
/// outside the port's lock does so inside `use`; a connection's socket
/// closes only through `close`, after the connection left the port's
/// table (whose entry found under the lock is therefore still open).
final class PortDescriptor: Sendable {
    let fd: Int32
    /// Twice the calls in progress, plus 1 once `close` was called.
    private let state = Atomic<UInt>(0)

    init(_ fd: Int32) { self.fd = fd }

    /// Runs `body` with the descriptor, which stays open until `body`
    /// returns (a `close` meanwhile is carried out by this call, on its
    /// way out); nil without calling it if the socket is closed already.
    /// Any thread; nests.
    func use<R, E: Error>(_ body: (Int32) throws(E) -> R) throws(E) -> R? {
        var current = state.load(ordering: .relaxed)
        while true {
            if current & 1 != 0 { return nil }
            let (exchanged, found) = state.compareExchange(
                expected: current, desired: current + 2, ordering: .acquiring)
            if exchanged { break }
            current = found
        }
        defer {
            // Acquiring and releasing: the last user's close comes after
            // every user's calls, and after the shutdown of `close`.
            if state.subtract(2, ordering: .acquiringAndReleasing).newValue == 1 { PortSocketCalls.close(fd) }
        }
        return try body(fd)
    }

    /// Shuts the socket down now and closes it once no call uses it (at
    /// once if none does). Any thread; again does nothing.
    func close() {
        // The shutdown as a user: the descriptor cannot close under it.
        guard use({ PortSocketCalls.shutdown($0) }) != nil else { return }
        if state.bitwiseOr(1, ordering: .acquiringAndReleasing).oldValue == 0 { PortSocketCalls.close(fd) }
    }
}
