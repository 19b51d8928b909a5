// Deadlines on any clock for the ports' timed calls: an instant of
// `ContinuousClock`, `SuspendingClock`, the wall clock or `MonotonicClock`,
// converted once, on entry. `LocalPort.send(_:before:)` has a `MonotonicClock`
// form of its own; `RemotePort`'s calls take a timeout, so their deadline
// forms pass the time left until the deadline (zero if it has passed: a
// single try), which ends the wait at the same instant.

extension LocalPort {
    /// As `send(_:before:)` with a `MonotonicClock` deadline, with
    /// `deadline` on any convertible clock, converted once on entry.
    /// Blocks while the queue is full, at most until `deadline`.
    @available(*, noasync, message: "waits for room in the port's queue; in async code run it on a pool worker (`try await WorkQueue.global().performReturning { ... }`)")
    public func send<Deadline: MonotonicClockConvertible>(
        _ message: PortEnvelope, before deadline: Deadline
    ) throws(PortError) {
        try send(message, before: deadline.monotonicInstant)
    }
}

extension RemotePort {
    /// As `lookup(_:owner:timeout:)`, waiting for the owner's loop until
    /// `deadline` (an instant of any `MonotonicClockConvertible` clock).
    /// Blocks.
    @available(*, noasync, message: "blocks until the owner accepts; in async code run it on a pool worker (`try await WorkQueue.global().performReturning { ... }`)")
    public static func lookup<Deadline: MonotonicClockConvertible>(
        _ name: String, owner: UInt32? = nil, before deadline: Deadline
    ) throws(PortError) -> RemotePort {
        try lookup(name, owner: owner, timeout: timeLeft(until: deadline))
    }

    /// As `connect(host:port:wireFormat:timeout:)`, giving up at `deadline`
    /// (an instant of any `MonotonicClockConvertible` clock). Blocks.
    @available(*, noasync, message: "blocks until connected; in async code run it on a pool worker (`try await WorkQueue.global().performReturning { ... }`)")
    public static func connect<Deadline: MonotonicClockConvertible>(
        host: String, port: UInt16, wireFormat: PortWireFormat = .spindle, before deadline: Deadline
    ) throws(PortError) -> RemotePort {
        try connect(host: host, port: port, wireFormat: wireFormat, timeout: timeLeft(until: deadline))
    }

    /// As `send(_:timeout:)`, waiting for room in the connection's buffer
    /// until `deadline` (an instant of any `MonotonicClockConvertible`
    /// clock). Blocks at most until `deadline`.
    @available(*, noasync, message: "waits for room in the connection; in async code run it on a pool worker (`try await WorkQueue.global().performReturning { ... }`)")
    public func send<Deadline: MonotonicClockConvertible>(
        _ message: PortEnvelope, before deadline: Deadline
    ) throws(PortError) {
        try send(message, timeout: Self.timeLeft(until: deadline))
    }

    /// As `sendRequest(_:timeout:replyTimeout:)`, with one deadline for the
    /// whole exchange: the request must be sent and its reply received by
    /// `deadline` (an instant of any `MonotonicClockConvertible` clock,
    /// converted once on entry). A deadline already passed still makes one
    /// try to send and one look for the reply. Blocks at most until
    /// `deadline`; one request at a time per `RemotePort`.
    ///
    ///     let reply = try server.sendRequest(PortEnvelope(id: 7), before: ContinuousClock.now + .seconds(2))
    ///
    /// - Throws: as `sendRequest(_:timeout:replyTimeout:)`: `.timedOut` if
    ///   the request could not be sent by `deadline`, `.replyTimedOut`
    ///   (with the time spent waiting for the reply) if it was sent but no
    ///   reply came by then.
    @available(*, noasync, message: "blocks until the reply; in async code run it on a pool worker (`try await WorkQueue.global().performReturning { ... }`)")
    public func sendRequest<Deadline: MonotonicClockConvertible>(
        _ message: PortEnvelope, before deadline: Deadline
    ) throws(PortError) -> PortEnvelope {
        let instant = deadline.monotonicInstant
        return try request(message, sendDeadline: instant, replyDeadline: instant, replyTimeout: .zero)
    }

    /// The time from now until `deadline`, zero if it has passed.
    static func timeLeft<Deadline: MonotonicClockConvertible>(until deadline: Deadline) -> Duration {
        max(.zero, MonotonicClock.now.duration(to: deadline.monotonicInstant))
    }
}
