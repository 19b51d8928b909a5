/// The replies a listening port (`NamedPort`, `NetworkPort`) owes one
/// connection and could not write at once: a requester that stops reading
/// fills its socket, and a reply that waited there for room would hold up
/// the port's loop, and every other source on it, for as long as it waited.
/// Instead the reply waits here, behind the connection's earlier ones, and
/// a writer (a descriptor source watching the socket for room, in the
/// port's modes, made with the first reply queued and gone once none is)
/// writes it as the socket drains. Replies leave in the order they were
/// made. Once `limit` bytes or more wait, the next reply is refused with
/// `.replyBacklogExceeded`, and the port closes the connection: a requester
/// that does not read costs at most about `limit` bytes and never the loop.
///
/// Generic over what a reply is on the wire: a frame of a stream, of which
/// a write may take part (`NetworkPort`), or an envelope sent whole as one
/// record, or not at all (`NamedPort`, whose record may put large buffers in
/// the connection's ring). `write` tries once, never waiting.
final class PortReplyOutbox<Reply>: @unchecked Sendable {
    // @unchecked: `waiting`, `head`, `offset`, `bytes`, `writer` and `closed`
    // are guarded by `lock`; `write` runs on the port's loop thread only
    // (its handlers), never under the lock; the rest is immutable.

    /// What one try of `write` did.
    enum Write {
        /// The whole reply went (from the offset given).
        case done
        /// Part of it went; the rest starts at this offset.
        case partial(Int)
        /// Nothing went: the socket has no room.
        case full
        /// The connection failed (its peer is gone, say).
        case failed(PortError)
    }

    /// The connection's descriptor, for the writer's source: made while
    /// the port's receive holds the socket open (`PortDescriptor.use`), and
    /// invalidated before the socket closes.
    private let fd: Int32
    private let limit: Int
    /// Writes a reply from an offset (0 unless an earlier try took part of
    /// it), once, without waiting.
    private let write: (Reply, Int) -> Write
    /// A reply's size on the wire, counted against `limit`.
    private let size: (Reply) -> Int
    /// Told why, when the writer found the connection failed; the port
    /// drops the connection.
    private let failed: @Sendable (PortError) -> Void

    private let lock = Lock()
    private var waiting: [Reply] = []
    /// The first of `waiting` not yet written, and how much of it went.
    private var head = 0
    private var offset = 0
    /// Bytes waiting, counting only what is left of the first reply.
    private var bytes = 0
    private var writer: LoopSource?
    private var closed = false

    init(
        fd: Int32, limit: Int, write: @escaping (Reply, Int) -> Write, size: @escaping (Reply) -> Int,
        failed: @escaping @Sendable (PortError) -> Void
    ) {
        self.fd = fd
        self.limit = limit
        self.write = write
        self.size = size
        self.failed = failed
    }

    /// Bytes of replies waiting for the requester to read. Any thread.
    var queuedBytes: Int { lock.withLock { bytes } }

    /// The writer, while replies wait: the port adds it to (and removes it
    /// from) its loop with its other sources. Any thread.
    var currentWriter: LoopSource? { lock.withLock { writer } }

    /// Sends `reply` now if nothing waits before it and the socket takes it
    /// whole; otherwise queues it (what is left of it) for the writer. The
    /// loop's thread. Returns the writer if it was just made: the caller
    /// adds it to its loop in its modes.
    ///
    /// - Throws: `.replyBacklogExceeded` if `limit` bytes or more wait
    ///   already (nothing is sent; the caller closes the connection), or the
    ///   write's error.
    func send(_ reply: Reply) throws(PortError) -> LoopSource? {
        let queued: Int? = lock.withLock { closed ? nil : bytes }
        guard let queued else { return nil }
        guard queued < limit else { throw .replyBacklogExceeded(bytes: queued + size(reply), limit: limit) }
        var start = 0
        if queued == 0 {
            switch write(reply, 0) {
            case .done: return nil
            case .partial(let n): start = n
            case .full: break
            case .failed(let error): throw error
            }
        }
        return lock.withLock { () -> LoopSource? in
            guard !closed else { return nil }
            if waiting.count == head { offset = start }
            waiting.append(reply)
            bytes += size(reply) - start
            guard writer == nil else { return nil }
            let made = LoopSource(descriptor: fd, interest: .writable) { _, _ in self.flush() }
            writer = made
            return made
        }
    }

    /// The writer's handler: writes waiting replies while the socket takes
    /// them; once none is left, the writer goes. A failed write closes the
    /// outbox and tells `failed`.
    private func flush() {
        while true {
            // Once none is left, the writer goes, in the same hold: a reply
            // queued after it finds no writer and makes one.
            let (next, gone): ((Reply, Int)?, LoopSource?) = lock.withLock {
                if closed { return (nil, nil) }
                guard head < waiting.count else {
                    defer { writer = nil }
                    return (nil, writer)
                }
                return ((waiting[head], offset), nil)
            }
            guard let (reply, from) = next else {
                gone?.invalidate()
                return
            }
            let result = write(reply, from)
            switch result {
            case .done, .partial:
                lock.withLock {
                    guard !closed else { return }
                    let upTo: Int
                    if case .partial(let n) = result { upTo = n } else { upTo = size(reply) }
                    bytes -= upTo - from
                    if case .partial(let n) = result {
                        offset = n
                    } else {
                        offset = 0
                        head += 1
                        if head == waiting.count {
                            waiting.removeAll(keepingCapacity: false)
                            head = 0
                        } else if head >= 64 && head * 2 >= waiting.count {
                            waiting.removeFirst(head)
                            head = 0
                        }
                    }
                }
                if case .partial = result { return }
            case .full:
                return
            case .failed(let error):
                close()
                failed(error)
                return
            }
        }
    }

    /// The connection closes: drops what waits and ends the writer. Any
    /// thread; again does nothing.
    func close() {
        let gone: LoopSource? = lock.withLock {
            closed = true
            waiting = []
            head = 0
            bytes = 0
            defer { writer = nil }
            return writer
        }
        gone?.invalidate()
    }
}

extension PortReplyOutbox where Reply == [UInt8] {
    /// For a stream (`NetworkPort`): a reply is a frame, of which a write
    /// may take part.
    convenience init(streamOf socket: PortDescriptor, limit: Int, failed: @escaping @Sendable (PortError) -> Void) {
        self.init(
            fd: socket.fd, limit: limit,
            write: { frame, from in
                let sent = socket.use { fd in
                    frame.withUnsafeBytes { PortSocketCalls.streamSendSome(fd, UnsafeRawBufferPointer(rebasing: $0[from...])) }
                }
                switch sent ?? .failed(.peerGone) {  // nil: the port closed the connection
                case .sent(let n): return from + n == frame.count ? .done : .partial(from + n)
                case .full: return .full
                case .failed(let error): return .failed(error)
                }
            },
            size: { $0.count }, failed: failed)
    }
}

/// A reply on a Unix-domain connection (`NamedPort`): the envelope, and the
/// sequence of the request it answers.
struct PortRecordReply {
    let envelope: PortEnvelope
    let sequence: UInt64
}

extension PortReplyOutbox where Reply == PortRecordReply {
    /// For a Unix-domain sequenced-packet connection (`NamedPort`): a reply
    /// is one record, which the socket takes whole or not at all, its large
    /// buffers in the connection's reply ring (`ring`, whose space a record
    /// not sent gives back). Counted as its record's header and buffers.
    convenience init(recordsOf socket: PortDescriptor, ring: PortSendRing, limit: Int, failed: @escaping @Sendable (PortError) -> Void) {
        self.init(
            fd: socket.fd, limit: limit,
            write: { reply, _ in
                do throws(PortError) {
                    // A deadline already passed: one try, no wait.
                    let sent: Void? = try socket.use { fd throws(PortError) in
                        try ring.send(reply.envelope, kind: .reply, sequence: reply.sequence, on: fd, before: .now)
                    }
                    return sent == nil ? .failed(.peerGone) : .done  // nil: the port closed the connection
                } catch {
                    if case .timedOut = error { return .full }
                    return .failed(error)
                }
            },
            size: { PortWire.headerSize + PortWire.componentSize * $0.envelope.components.count + $0.envelope.byteCount },
            failed: failed)
    }
}
