import CShims

#if canImport(Glibc)
import Glibc
#endif

/// Large byte buffers between a `RemotePort` and its `NamedPort` through
/// shared memory, each way: the sender's ring (a `RemotePort`'s for its
/// messages, a `NamedPort` connection's for its replies), a memfd it maps
/// and passes to the receiver once, in a record of its own
/// (`PortWire.Kind.ring`).
///
///     offset 0      consumed  u64, written by the receiver: every ring byte
///                             before it has been copied out
///     offset 4096   the ring's bytes, `capacity` of them
///
/// A buffer of 16 KiB or more, or one that does not fit a record inline,
/// goes into the ring at the sender's head (wrapping at the end), and the
/// record carries where: the ring's id and the buffer's offset from the
/// ring's start, counted without wrapping (16 bytes in the record's inline
/// area). The receiver copies the buffer out and moves `consumed` past it.
/// That is two copies, where a buffer inline takes four (into the record,
/// into the socket, out of it, out of the record) and one in a sealed memfd
/// a `memfd_create`, the seals, a `close` and the kernel allocating,
/// zeroing and freeing its pages: the ring's pages stay in place. Its cost
/// is the ring's memory, `capacity` plus a page per sending port that has
/// sent such a buffer, held while the port lives. A ring without room
/// never makes a sender wait: the buffer goes in a memfd.
///
/// Neither side trusts the other: the receiver checks the memfd's seals
/// (no shrinking, so a mapping never faults) and size and every offset; the
/// sender treats a `consumed` that does not add up as a broken ring and
/// goes back to memfds. A peer that writes into the ring while the other
/// reads only garbles its own messages.
///
/// The ring belongs to the process that made it: after `fork()` a child
/// sending on an inherited port makes a ring of its own, so the two never
/// write into one ring.
final class PortSendRing: @unchecked Sendable {
    // @unchecked: `ring` and `broken` are guarded by `lock`, which `send`
    // holds from `prepare` through its `commit` or `rollback`.

    /// Bytes of ring behind the header.
    static let capacity = 4 << 20
    /// The header: one page, `consumed` at its start.
    static let headerSize = 4096
    /// Buffers above this go in sealed memfds: a ring half full of one
    /// buffer still takes the next.
    static let largestBuffer = capacity / 2
    /// Buffers from this size up go in the ring even where they would fit
    /// inline: two copies (into the ring, out of it) instead of four (into
    /// the record, into the socket, out of it, out of the record).
    static let smallestBuffer = 16 << 10

    private struct Ring {
        let id: UInt64
        let base: UnsafeMutableRawPointer
        let pid: pid_t
        /// Everything before it was written by a sent record.
        var head: UInt64 = 0
        /// Where the record being encoded has written up to.
        var pending: UInt64 = 0

        var consumedWord: UnsafeMutablePointer<UInt64> { base.assumingMemoryBound(to: UInt64.self) }
    }

    private let lock = Lock()
    private var ring: Ring?
    /// Set once the receiver's `consumed` did not add up; memfds from then on.
    private var broken = false

    deinit {
        if let ring { cshims_port_ring_unmap(ring.base, Self.headerSize + Self.capacity) }
    }

    /// Whether `envelope` holds a buffer the ring would take (one of
    /// `smallestBuffer` or more, or more bytes than go inline): only then
    /// does `send` take the ring's lock.
    private static func wants(_ envelope: PortEnvelope) -> Bool {
        envelope.byteCount > PortWire.inlineBudget
            || envelope.components.contains { $0.bytes.map { $0.count >= smallestBuffer } ?? false }
    }

    /// Whether a buffer of `count` bytes goes in the ring, with `inlineTotal`
    /// bytes of the record's `budget` inline already.
    static func takes(_ count: Int, inlineTotal: Int, budget: Int) -> Bool {
        count <= largestBuffer && inlineTotal + 16 <= budget
            && (count >= smallestBuffer || inlineTotal + count > budget)
    }

    /// Under `lock`: makes the ring and introduces it on `fd` if this
    /// process has none yet (`send` calls it). Returns false (the message goes without it) if
    /// the ring is broken or could not be made or introduced.
    private func prepare(fd: Int32, before deadline: MonotonicClock.Instant) -> Bool {
        if broken { return false }
        let pid = getpid()
        if let existing = ring {
            if existing.pid == pid { return true }
            // Inherited across fork(): the parent's; leave it to the parent.
            cshims_port_ring_unmap(existing.base, Self.headerSize + Self.capacity)
            ring = nil
        }
        var map: UnsafeMutableRawPointer?
        let ringFD = cshims_port_ring_create(Self.headerSize + Self.capacity, &map)
        guard ringFD >= 0, let base = map else { return false }
        defer { PortSocketCalls.close(ringFD) }
        let made = Ring(id: UInt64.random(in: 1...UInt64.max), base: base, pid: pid)
        do throws(PortError) {
            try PortSocketCalls.send(fd, PortWire.ringIntroduction(id: made.id), fds: [ringFD], before: deadline)
        } catch {
            cshims_port_ring_unmap(base, Self.headerSize + Self.capacity)
            return false
        }
        ring = made
        return true
    }

    /// Under `lock`, after `prepare`: copies `bytes` into the ring for the
    /// record being encoded; returns the ring's id and the offset, or nil
    /// if there is no room (the buffer goes in a memfd).
    func place(_ bytes: [UInt8]) -> (id: UInt64, offset: UInt64)? {
        guard var r = ring, bytes.count <= Self.largestBuffer else { return nil }
        // Acquiring: the receiver's copies out of what it consumed happen
        // before this overwrites them.
        let consumed = AtomicMemory.load(from: r.consumedWord, ordering: .acquiring)
        guard consumed <= r.head, r.head - consumed <= UInt64(Self.capacity) else {
            broken = true
            return nil
        }
        let used = r.pending - consumed
        guard UInt64(Self.capacity) - used >= UInt64(bytes.count) else { return nil }
        let offset = r.pending
        let data = r.base + Self.headerSize
        let start = Int(offset % UInt64(Self.capacity))
        let first = min(bytes.count, Self.capacity - start)
        bytes.withUnsafeBytes { source in
            guard let from = source.baseAddress else { return }
            (data + start).copyMemory(from: from, byteCount: first)
            if first < bytes.count { data.copyMemory(from: from + first, byteCount: bytes.count - first) }
        }
        r.pending += UInt64(bytes.count)
        ring = r
        return (r.id, offset)
    }

    /// Encodes `message` and sends it on `fd` (a Unix-domain sequenced-packet
    /// socket) as one record, waiting at most until `deadline` for room in
    /// the socket. A message with no buffer for the ring goes as is, without
    /// the lock. Otherwise its large buffers go in the ring (memfds where it
    /// has no room, or if it cannot be made), and the ring is held from the
    /// first byte placed to the record's send, so that records reach the
    /// receiver in the order their buffers sit in the ring; a record not
    /// sent gives its space back.
    func send(
        _ message: PortEnvelope, kind: PortWire.Kind, sequence: UInt64, on fd: Int32, before deadline: MonotonicClock.Instant
    ) throws(PortError) {
        guard Self.wants(message) else {
            let record = try PortWire.encode(message, kind: kind, sequence: sequence)
            defer { PortSocketCalls.close(record.fds) }
            try PortSocketCalls.send(fd, record.bytes, fds: record.fds, before: deadline)
            return
        }
        // Refused before the ring is made or introduced for it.
        try message.checkLimits()
        lock.lock()
        defer { lock.unlock() }
        let ring = prepare(fd: fd, before: deadline) ? self : nil
        do throws(PortError) {
            let record = try PortWire.encode(message, kind: kind, sequence: sequence, ring: ring)
            defer { PortSocketCalls.close(record.fds) }
            try PortSocketCalls.send(fd, record.bytes, fds: record.fds, before: deadline)
        } catch {
            rollback()
            throw error
        }
        commit()
    }

    /// Under `lock`: the record was sent; what it placed stays.
    private func commit() {
        if var r = ring {
            r.head = r.pending
            ring = r
        }
    }

    /// Under `lock`: the record was not sent; its space is free again.
    private func rollback() {
        if var r = ring {
            r.pending = r.head
            ring = r
        }
    }
}

/// The rings a connection's senders introduced: a `NamedPort`
/// connection's (mapped for as long as the connection's source lives: its
/// loop thread may be copying out of one while another thread drops the
/// connection), or a `RemotePort`'s for the owner's replies. One thread at
/// a time: the loop thread, or the requester holding the port's request
/// lock.
final class PortReceiveRings: @unchecked Sendable {
    // @unchecked: touched by one thread at a time (the connection's loop
    // thread, or the holder of the `RemotePort`'s request lock), and freed
    // when the last reference goes.

    /// At most this many senders' rings per connection (processes sharing
    /// one connection through send rights passed in messages); an
    /// introduction beyond it is malformed.
    static let limit = 64

    private var rings: [UInt64: UnsafeMutableRawPointer] = [:]
    /// Buffers taken since the last `takeCount()`.
    private var taken = 0
    private var mapped: Int { PortSendRing.headerSize + PortSendRing.capacity }

    deinit {
        for base in rings.values { cshims_port_ring_unmap(base, mapped) }
    }

    /// Buffers taken out of the rings since the last call.
    func takeCount() -> Int {
        defer { taken = 0 }
        return taken
    }

    /// Maps the ring `fd` (which the caller still closes) under `id`.
    func adopt(id: UInt64, fd: Int32) throws(PortError) {
        guard rings[id] == nil else { throw .malformed("ring \(id) introduced twice") }
        guard rings.count < Self.limit else { throw .malformed("more than \(Self.limit) rings on one connection") }
        var map: UnsafeMutableRawPointer?
        let rc = cshims_port_ring_map(fd, mapped, &map)
        guard rc == 0, let base = map else {
            throw .malformed("ring \(id) is not a sealed memfd of \(mapped) bytes (\(errnoDescription(-rc)))")
        }
        rings[id] = base
    }

    /// Copies `length` bytes at `offset` out of ring `id` and marks them
    /// consumed.
    func take(id: UInt64, offset: UInt64, length: Int) throws(PortError) -> [UInt8] {
        guard let base = rings[id] else { throw .malformed("a buffer in ring \(id), which was never introduced") }
        let capacity = PortSendRing.capacity
        guard length <= PortSendRing.largestBuffer else { throw .malformed("a ring buffer of \(length) bytes") }
        let data = UnsafeRawPointer(base + PortSendRing.headerSize)
        let start = Int(offset % UInt64(capacity))
        let first = min(length, capacity - start)
        let bytes = [UInt8](unsafeUninitializedCapacity: length) { buffer, initialized in
            if let to = buffer.baseAddress {
                UnsafeMutableRawPointer(to).copyMemory(from: data + start, byteCount: first)
                if first < length { UnsafeMutableRawPointer(to + first).copyMemory(from: data, byteCount: length - first) }
            }
            initialized = length
        }
        // Releasing: the copy above happens before the sender reuses the space.
        AtomicMemory.store(offset &+ UInt64(length), to: base.assumingMemoryBound(to: UInt64.self), ordering: .releasing)
        taken += 1
        return bytes
    }
}
