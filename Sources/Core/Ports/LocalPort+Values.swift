/// A `LocalPort` that carries values of any `Sendable` type between the
/// threads of one process, rather than byte buffers and ports: the
/// in-process use of Foundation's `NSPort` with an object as the message,
/// delivered the same way, on the thread of the loop the port is added to,
/// one value per call of `handler`, in the order sent.
///
///     let results = LocalValuePort<Result<Int, any Error>> { print($0) }
///     results.schedule(in: worker.loop)
///     try results.send(.success(42), timeout: .seconds(1))
///
/// It is built on a `LocalPort` (`port`), so it has that port's capacity
/// and back-pressure (a send waits for room, at most its timeout), its
/// invalidation and its loop membership. The value itself never enters the
/// envelope: it waits in the port's table under a ticket number, and the
/// envelope carries the ticket; the delivery takes the value out of the
/// table. A send that throws leaves nothing behind (its value is removed
/// again), and a value still waiting when the port is invalidated is
/// dropped with the port.
///
/// Memory: as for `LocalPort`, a send orders like a release and the
/// delivery like an acquire, so what the sender wrote before sending is
/// visible to the handler (the value's table is guarded by a lock, too).
/// Any method may be called from any thread.
public final class LocalValuePort<Value: Sendable>: Sendable {
    /// The port underneath: its `capacity`, `queuedCount`, `isValid`,
    /// `onInvalidation(_:)` apply to this one.
    public let port: LocalPort
    private let table: LockedValue<Table>

    private struct Table {
        var nextTicket: UInt64 = 0
        var waiting: [UInt64: Value] = [:]
    }

    /// A port whose values `handler` receives on the thread of the loop it
    /// is added to, one per call, in the order they were sent.
    ///
    /// - Parameters:
    ///   - capacity: How many values may wait for the loop before a send has
    ///     to wait for room; at least 1 (a precondition failure otherwise,
    ///     naming `LocalPort.init`), 1,024 by default.
    ///   - handler: Runs on the receiving loop's thread.
    public init(capacity: Int = 1024, _ handler: @escaping @Sendable (Value) -> Void) {
        let table = LockedValue(Table())
        self.table = table
        port = LocalPort(capacity: capacity) { envelope in
            guard let ticket = LocalValuePort.ticket(in: envelope) else { return }
            let value = table.withLock { $0.waiting.removeValue(forKey: ticket) }
            if let value { handler(value) }
        }
    }

    /// Queues `value` for the port's loop, waiting at most `timeout` for
    /// room if the queue is full (`.zero`: never wait). Any thread; blocks
    /// at most `timeout`. A negative `timeout` is a precondition failure.
    ///
    /// - Throws: `PortError.timedOut` if the queue stayed full,
    ///   `.invalidated` if the port is or becomes invalid first. Nothing is
    ///   queued when it throws.
    @available(*, noasync, message: "waits for room in the port's queue; in async code run it on a pool worker (`try await WorkQueue.global().performReturning { ... }`)")
    public func send(_ value: Value, timeout: Duration) throws(PortError) {
        require(timeout >= .zero, "LocalValuePort.send: `timeout` is \(timeout); it cannot be negative")
        try send(value, before: MonotonicClock.now.advanced(by: timeout))
    }

    /// As `send(_:timeout:)`, waiting for room until `deadline`, an instant
    /// of any `MonotonicClockConvertible` clock (`.distantFuture`: as long
    /// as it takes).
    @available(*, noasync, message: "waits for room in the port's queue; in async code run it on a pool worker (`try await WorkQueue.global().performReturning { ... }`)")
    public func send<Deadline: MonotonicClockConvertible>(_ value: Value, before deadline: Deadline) throws(PortError) {
        let ticket = table.withLock { table in
            let ticket = table.nextTicket
            table.nextTicket &+= 1
            table.waiting[ticket] = value
            return ticket
        }
        do {
            try port.send(Self.envelope(for: ticket), before: deadline.monotonicInstant)
        } catch {
            table.withLock { _ = $0.waiting.removeValue(forKey: ticket) }
            throw error
        }
    }

    /// Values sent and not yet delivered. A snapshot; takes a lock briefly.
    public var waitingCount: Int { table.withLock { $0.waiting.count } }

    /// Adds the port to `loop` in `mode` (see `LocalPort.schedule(in:forMode:)`).
    public func schedule(in loop: ThreadLoop, forMode mode: LoopMode = .default) {
        port.schedule(in: loop, forMode: mode)
    }

    /// Removes the port from `mode` of `loop` (see
    /// `LocalPort.remove(from:forMode:)`).
    public func remove(from loop: ThreadLoop, forMode mode: LoopMode = .default) {
        port.remove(from: loop, forMode: mode)
    }

    /// Invalidates the port: later sends throw `.invalidated`, and values
    /// not yet delivered are dropped. Any thread; calling it again does
    /// nothing.
    public func invalidate() {
        port.invalidate()
        table.withLock { $0.waiting.removeAll() }
    }

    private static func envelope(for ticket: UInt64) -> PortEnvelope {
        PortEnvelope(id: 0, components: [.bytes(withUnsafeBytes(of: ticket.littleEndian) { Array($0) })])
    }

    private static func ticket(in envelope: PortEnvelope) -> UInt64? {
        guard envelope.components.count == 1, let bytes = envelope.components[0].bytes, bytes.count == 8 else {
            return nil
        }
        var ticket: UInt64 = 0
        for (i, byte) in bytes.enumerated() { ticket |= UInt64(byte) << (8 * UInt64(i)) }
        return ticket
    }
}
