import CShims
import Synchronization

/// How a `PortEnvelope` crosses a process boundary: one sequenced-packet
/// record plus the descriptors it carries (SCM_RIGHTS).
///
///     header, 24 bytes, little-endian
///       0  magic          u32  0x504E5053 ("SPNP")
///       4  kind           u8   one-way 0, request 1, reply 2, welcome 3, refused 4,
///                                ring 5 (a sender's ring: no components, its
///                                memfd the one descriptor, its id the sequence)
///       5  reserved       u8 × 3, zero
///       8  message id     u32
///      12  components     u32  at most PortEnvelope.maximumComponentCount
///      16  sequence       u64  pairs a reply with its request
///     then per component 8 bytes
///       0  kind           u8   inline bytes 0, bytes in a sealed memfd 1, port 2,
///                                bytes in the sender's ring 3
///       1  reserved       u8 × 3, zero
///       4  length         u32  bytes (0 for a port)
///     then the inline components' bytes, back to back.
///
/// A memfd or port component takes the next descriptor, in component order.
/// A ring component takes 16 bytes of the inline area, in component order:
/// the ring's id (u64) and the buffer's offset in it (u64; see
/// `PortSendRing`).
/// Byte components of 16 KiB or more go in the sender's ring when it has
/// room (never waiting for room); the others go inline while the record's
/// inline bytes stay within `inlineBudget`; the rest go in the ring, or in
/// sealed memfds when it has no room, so a record fits a default
/// socket buffer (net.core.wmem_default, 212,992 bytes) whatever the
/// message's size. The receiver checks everything; a record that does not
/// add up is an error on its connection only.
enum PortWire {
    static let magic: UInt32 = 0x504E_5053

    /// Registers, once per process (the first port made), a `fork()`
    /// prepare handler, `prepareForFork`. A child's first request runs the
    /// ports' client code at once; in a debug build that code makes generic
    /// metadata and looks up conformances under the Swift runtime's locks
    /// the first time it runs, and a child forked while a parent thread was
    /// in its first request, holding such a lock, waited for it forever
    /// (seen twice in `RemotePortForkWhileInUseTests`: a child hung in
    /// `swift_getWitnessTable` under `append(_:to:)`, and one making the
    /// tuple of `RemotePort.withDescriptor`). Run in the parent, the
    /// handler waits for that thread instead, and the child finds the
    /// caches filled (`ForkHandlers.makeMetadata`).
    static let forkWarmUpRegistered: Void = {
        ForkHandlers.register(.ports, prepare: { PortWire.prepareForFork() }, child: { _ in })
    }()

    /// In the parent, before `fork()`: every generic type and conformance
    /// that the client side of a port (`RemotePort`, the wire, the send
    /// ring, the socket calls) makes on first use, which
    /// `scripts/check-fork-metadata` checks against the object files; then
    /// a one-component request encoded and decoded. A few microseconds per
    /// fork, in processes that made a port.
    static func prepareForFork() {
        RemotePort.prepareForFork()
        ForkHandlers.makeMetadata(
            PortError?.self, [RemotePort].self, [PortEnvelope.Component].self, [[UInt8]].self, [Bool].self,
            [Int].self, [Int32].self, [UInt8].self, [UInt8]?.self, ArraySlice<UInt8>.self, ArraySlice<Int32>.self,
            IndexingIterator<[RemotePort]>.self, IndexingIterator<[PortEnvelope.Component]>.self,
            IndexingIterator<[[UInt8]]>.self, IndexingIterator<[Int32]>.self, PartialRangeFrom<Int>.self,
            EnumeratedSequence<[Int32]>.self, EnumeratedSequence<[Int32]>.Iterator.self,
            (UInt8, Int).self, (UInt8, UInt32, Int, UInt64).self, Result<Decoded, PortError>.self,
            [UInt64: UnsafeMutableRawPointer].self, [UInt64: UnsafeMutableRawPointer].Values.Iterator.self,
            (UInt64, UnsafeMutableRawPointer).self, UnsafeRawPointer?.self, [UnsafeRawBufferPointer].self,
            (count: Int, fds: [Int32], truncated: Bool).self, PortOwner?.self, String?.self)
        ForkHandlers.makeMetadata(ofNoncopyable: Atomic<UInt>.self)
        ForkHandlers.makeConformance(equatable: Kind.self)
        ForkHandlers.makeConformance(rawRepresentable: Kind.self)
        ForkHandlers.makeConformance(error: PortError.self)
        ForkHandlers.makeConformance(hashable: PortError.self)
        ForkHandlers.makeConformance(equatable: PortError.self)
        ForkHandlers.makeConformance(hashable: SystemCallError.self)
        ForkHandlers.makeConformance(equatable: SystemCallError.self)
        ForkHandlers.makeConformance(hashable: PortOwner.self)
        ForkHandlers.makeConformance(equatable: PortOwner.self)
        ForkHandlers.makeConformance(described: PortOwner.self)
        ForkHandlers.makeConformance(hashable: PortOwner?.self)
        ForkHandlers.makeConformance(hashable: String?.self)
        ForkHandlers.makeConformance(hashable: Int32?.self)
        ForkHandlers.makeConformance(hashable: PortWireFormat.self)
        ForkHandlers.makeConformance(equatable: PortWireFormat.self)
        ForkHandlers.makeConformance(comparable: MonotonicClock.Instant.self)
        ForkHandlers.makeConformance(binaryInteger: Int.self)
        ForkHandlers.makeConformance(fixedWidthInteger: UInt32.self)
        ForkHandlers.makeConformance(fixedWidthInteger: UInt64.self)
        ForkHandlers.makeConformance(atomicWord: UInt64.self)
        ForkHandlers.makeConformance(collection: UnsafeRawBufferPointer.self)
        ForkHandlers.makeConformance(mutable: UnsafeMutableRawBufferPointer.self)
        ForkHandlers.makeConformance(sequence: String.UTF8View.self)
        ForkHandlers.makeConformance(rangeExpression: PartialRangeFrom<Int>.self)
        ForkHandlers.makeConformance(collection: [RemotePort].self)
        ForkHandlers.makeConformance(sequence: [PortEnvelope.Component].self)
        ForkHandlers.makeConformance(collection: [PortEnvelope.Component].self)
        ForkHandlers.makeConformance(sequence: [[UInt8]].self)
        ForkHandlers.makeConformance(collection: [[UInt8]].self)
        ForkHandlers.makeConformance(collection: [Int].self)
        ForkHandlers.makeConformance(sequence: [Int32].self)
        ForkHandlers.makeConformance(collection: [Int32].self)
        ForkHandlers.makeConformance(rangeReplaceable: [UInt8].self)
        ForkHandlers.makeConformance(mutable: [UInt8].self)
        ForkHandlers.makeConformance(sequence: ArraySlice<UInt8>.self)
        ForkHandlers.makeConformance(sequence: ArraySlice<Int32>.self)
        ForkHandlers.makeConformance(sequence: [UnsafeRawBufferPointer].self)
        guard let record = try? encode(PortEnvelope(id: 1, components: [.bytes([1])]), kind: .request, sequence: 1)
        else { return }
        record.bytes.withUnsafeBytes { buffer in _ = try? decode(buffer, count: buffer.count, fds: []) }
    }

    enum Kind: UInt8 {
        case oneWay = 0
        case request = 1
        case reply = 2
        /// Sent by a named port to a process it accepted, before anything else.
        case welcome = 3
        /// Sent by a named port to a process whose user it does not accept,
        /// before it closes the connection.
        case refused = 4
        /// A sender's ring for large buffers (`PortSendRing`), before the
        /// first record that uses it.
        case ring = 5
    }

    static let headerSize = 24
    static let componentSize = 8
    /// At most this many bytes inline per record: 64 KiB, a quarter of a
    /// default socket buffer, so a few records can be in flight at once.
    static let inlineBudget = 64 << 10
    /// The largest well-formed record.
    static let recordCapacity = headerSize + componentSize * PortEnvelope.maximumComponentCount + inlineBudget

    /// A record ready to send; `fds` are descriptors made for it (memfds,
    /// duplicates of ports), which the sender closes once it is sent.
    struct Record {
        var bytes: [UInt8]
        var fds: [Int32]
    }

    /// Encodes `envelope`. Throws if it is over its limits or holds a
    /// `LocalPort`; nothing is left open then.
    ///
    /// For a stream between hosts (`descriptors` false), every byte buffer
    /// goes inline and a `.remotePort` cannot be sent.
    ///
    /// With `ring` (held and prepared by the caller), a buffer that does not
    /// fit inline goes into it if it has room; the caller commits or rolls
    /// back once the record is sent or not.
    static func encode(
        _ envelope: PortEnvelope, kind: Kind, sequence: UInt64, descriptors: Bool = true, ring: PortSendRing? = nil
    ) throws(PortError) -> Record {
        let budget = descriptors ? inlineBudget : Int.max
        try envelope.checkLimits()
        if envelope.replyPort != nil { throw .notTransferable("a LocalPort (the envelope's replyPort)") }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(headerSize + componentSize * envelope.components.count)
        append(magic, to: &bytes)
        bytes += [kind.rawValue, 0, 0, 0]
        append(envelope.id, to: &bytes)
        append(UInt32(envelope.components.count), to: &bytes)
        append(sequence, to: &bytes)
        var fds: [Int32] = []
        var inline: [[UInt8]] = []
        var inlineTotal = 0
        do throws(PortError) {
            for component in envelope.components {
                switch component {
                case .bytes(let b):
                    if let ring, PortSendRing.takes(b.count, inlineTotal: inlineTotal, budget: budget),
                       let place = ring.place(b)
                    {
                        inlineTotal += 16
                        var position: [UInt8] = []
                        append(place.id, to: &position)
                        append(place.offset, to: &position)
                        inline.append(position)
                        bytes += [3, 0, 0, 0]
                    } else if inlineTotal + b.count <= budget {
                        inlineTotal += b.count
                        inline.append(b)
                        bytes += [0, 0, 0, 0]
                    } else {
                        fds.append(try PortSocketCalls.sealedMemfd(b))
                        bytes += [1, 0, 0, 0]
                    }
                    append(UInt32(b.count), to: &bytes)
                case .remotePort(let port):
                    guard descriptors else { throw .notTransferable("a RemotePort (to another host)") }
                    fds.append(try port.duplicateDescriptor())
                    bytes += [2, 0, 0, 0, 0, 0, 0, 0]
                case .port:
                    throw .notTransferable("a LocalPort (a component)")
                }
            }
        } catch {
            PortSocketCalls.close(fds)
            throw error
        }
        // The kernel passes at most SCM_MAX_FD descriptors in one message.
        guard fds.count <= Int(CSHIMS_PORT_MAX_FDS) else {
            PortSocketCalls.close(fds)
            throw .tooManyComponents(count: fds.count, limit: Int(CSHIMS_PORT_MAX_FDS))
        }
        for b in inline { bytes += b }
        return Record(bytes: bytes, fds: fds)
    }

    /// A record decoded: its kind, sequence and envelope.
    struct Decoded {
        let kind: Kind
        let sequence: UInt64
        let envelope: PortEnvelope
    }

    /// Decodes a record of `count` bytes in `buffer` that came with `fds`.
    /// Takes the descriptors over: ports become `RemotePort`s, memfds are
    /// read and closed, and on any error all are closed.
    /// `rings`: the connection's senders' rings (a `NamedPort`'s), which a
    /// ring record adds to and ring components are read from; without them
    /// either is malformed.
    static func decode(
        _ buffer: UnsafeRawBufferPointer, count: Int, fds: [Int32], rings: PortReceiveRings? = nil
    ) throws(PortError) -> Decoded {
        // Which of `fds` this function has taken care of (a memfd read and
        // closed, a port adopted); the others are closed on failure.
        var consumed = [Bool](repeating: false, count: fds.count)
        var adopted: [RemotePort] = []
        do throws(PortError) {
            func fail(_ why: String) -> PortError { .malformed(why) }
            guard count >= headerSize else { throw fail("a record of \(count) bytes is shorter than the header") }
            guard load(UInt32.self, buffer, 0) == magic else { throw fail("bad magic number") }
            guard let kind = Kind(rawValue: buffer[4]) else { throw fail("unknown record kind \(buffer[4])") }
            let id = load(UInt32.self, buffer, 8)
            let componentCount = Int(load(UInt32.self, buffer, 12))
            let sequence = load(UInt64.self, buffer, 16)
            if kind == .ring {
                guard let rings else { throw fail("a ring, which only a named port's connection takes") }
                guard count == headerSize, componentCount == 0, fds.count == 1 else {
                    throw fail("a ring record with \(componentCount) components, \(count) bytes and \(fds.count) descriptors")
                }
                try rings.adopt(id: sequence, fd: fds[0])
                PortSocketCalls.close(fds[0])
                consumed[0] = true
                return Decoded(kind: kind, sequence: sequence, envelope: PortEnvelope(id: id))
            }
            guard componentCount <= PortEnvelope.maximumComponentCount else {
                throw fail("\(componentCount) components, over the limit of \(PortEnvelope.maximumComponentCount)")
            }
            var offset = headerSize + componentSize * componentCount
            guard offset <= count else { throw fail("the component table runs past the record's end") }
            var nextFD = 0
            var total = 0
            var components: [PortEnvelope.Component] = []
            components.reserveCapacity(componentCount)
            for i in 0..<componentCount {
                let entry = headerSize + componentSize * i
                let length = Int(load(UInt32.self, buffer, entry + 4))
                switch buffer[entry] {
                case 0:
                    guard offset + length <= count else { throw fail("component \(i) runs past the record's end") }
                    total += length
                    components.append(.bytes(Array(UnsafeRawBufferPointer(rebasing: buffer[offset..<offset + length]))))
                    offset += length
                case 1:
                    guard nextFD < fds.count else { throw fail("component \(i) lacks its descriptor") }
                    total += length
                    guard total <= PortEnvelope.maximumByteCount else { throw fail("over \(PortEnvelope.maximumByteCount) bytes") }
                    let bytes = PortSocketCalls.readSealedMemfd(fds[nextFD], count: length)
                    PortSocketCalls.close(fds[nextFD])
                    consumed[nextFD] = true
                    nextFD += 1
                    guard let bytes else { throw fail("component \(i)'s memfd is not sealed or not \(length) bytes") }
                    components.append(.bytes(bytes))
                case 3:
                    guard let rings else { throw fail("component \(i) is in a ring, which only a named port's connection takes") }
                    guard offset + 16 <= count else { throw fail("component \(i)'s ring position runs past the record's end") }
                    total += length
                    guard total <= PortEnvelope.maximumByteCount else { throw fail("over \(PortEnvelope.maximumByteCount) bytes") }
                    let ring = load(UInt64.self, buffer, offset)
                    let position = load(UInt64.self, buffer, offset + 8)
                    components.append(.bytes(try rings.take(id: ring, offset: position, length: length)))
                    offset += 16
                case 2:
                    guard nextFD < fds.count else { throw fail("component \(i) lacks its descriptor") }
                    guard length == 0 else { throw fail("port component \(i) has a length") }
                    let port = RemotePort(adopting: fds[nextFD], name: nil)
                    consumed[nextFD] = true
                    adopted.append(port)
                    components.append(.remotePort(port))
                    nextFD += 1
                case let other:
                    throw fail("component \(i) has unknown kind \(other)")
                }
            }
            guard offset == count else { throw fail("\(count - offset) bytes after the last component") }
            guard nextFD == fds.count else { throw fail("\(fds.count - nextFD) descriptors more than its components") }
            guard total <= PortEnvelope.maximumByteCount else { throw fail("over \(PortEnvelope.maximumByteCount) bytes") }
            return Decoded(kind: kind, sequence: sequence, envelope: PortEnvelope(id: id, components: components))
        } catch {
            // Adopted ports close their own descriptors; close the rest.
            for (i, fd) in fds.enumerated() where !consumed[i] { PortSocketCalls.close(fd) }
            for port in adopted { port.invalidate() }
            throw error
        }
    }

    // MARK: Frames, for streams (TCP)

    /// The largest record a frame may hold: a full component table and the
    /// most bytes an envelope may carry, all inline.
    static let maximumFrameRecord = headerSize + componentSize * PortEnvelope.maximumComponentCount + PortEnvelope.maximumByteCount

    /// A frame for a stream, in two parts: `head`, the record's length, its
    /// header and its component table, and `parts`, the envelope's byte
    /// buffers, which follow the head on the stream as they are (every
    /// buffer inline): a sender writes them from the caller's buffers with
    /// one gathering write, copying nothing. Throws as `encode` does for a
    /// stream (over the limits, a `LocalPort`, a `RemotePort`).
    static func streamFrame(_ envelope: PortEnvelope, kind: Kind, sequence: UInt64) throws(PortError) -> (head: [UInt8], parts: [[UInt8]]) {
        try envelope.checkLimits()
        if envelope.replyPort != nil { throw .notTransferable("a LocalPort (the envelope's replyPort)") }
        var parts: [[UInt8]] = []
        parts.reserveCapacity(envelope.components.count)
        var total = 0
        for component in envelope.components {
            switch component {
            case .bytes(let b):
                parts.append(b)
                total += b.count
            case .remotePort: throw .notTransferable("a RemotePort (to another host)")
            case .port: throw .notTransferable("a LocalPort (a component)")
            }
        }
        let recordLength = headerSize + componentSize * parts.count + total
        var head: [UInt8] = []
        head.reserveCapacity(4 + headerSize + componentSize * parts.count)
        append(UInt32(recordLength), to: &head)
        append(magic, to: &head)
        head += [kind.rawValue, 0, 0, 0]
        append(envelope.id, to: &head)
        append(UInt32(parts.count), to: &head)
        append(sequence, to: &head)
        for b in parts {
            head += [0, 0, 0, 0]
            append(UInt32(b.count), to: &head)
        }
        return (head, parts)
    }

    /// `streamFrame`'s frame in one buffer (for a queue of reply bytes).
    static func contiguousStreamFrame(_ envelope: PortEnvelope, kind: Kind, sequence: UInt64) throws(PortError) -> [UInt8] {
        var (bytes, parts) = try streamFrame(envelope, kind: kind, sequence: sequence)
        bytes.reserveCapacity(bytes.count + parts.reduce(0) { $0 + $1.count })
        for b in parts { bytes += b }
        return bytes
    }

    /// What `FrameReader.next()` returns: a whole frame's bytes (the record
    /// behind the length for `.spindle`, the whole frame for
    /// `.foundationSocketPort`), for the caller to decode; or, for a large
    /// `.spindle` frame read straight into its buffers, the record decoded.
    enum Frame {
        case record([UInt8])
        case decoded(Decoded)
    }

    /// Cuts a byte stream into frames of `format`. For `.spindle`, a length
    /// below a header or above `maximumFrameRecord` is malformed; for
    /// `.foundationSocketPort`, a wrong magic number or a length outside
    /// `FoundationPortWire`'s bounds. The stream cannot be trusted past
    /// either, so its connection is closed.
    ///
    /// Bytes reach it two ways. The caller reads into a buffer of its own and
    /// `append`s them; that is how small frames arrive, several per read.
    /// A `.spindle` frame whose record is `directThreshold` bytes or more
    /// (and at most `directLimit`) is read straight into its buffers
    /// instead: once its header and component table are here (and checked,
    /// as `decode` would), the reader allocates each component's buffer at
    /// its final size, moves the bytes that came with the header into them,
    /// and `readDirect` hands the caller the rest of the current buffer to
    /// read the stream into. The frame's bytes are then copied once, by the
    /// kernel, and `next()` returns the envelope with those very buffers.
    /// The buffers are allocated when the header arrives, so such a frame
    /// counts whole in `partialFrameBytes` from then on.
    struct FrameReader {
        let format: PortWireFormat
        /// Records of at least this many bytes are read straight into their
        /// buffers.
        let directThreshold: Int
        /// Records over this many bytes go through the staging buffer
        /// (which holds only the bytes that came), so that a peer's header
        /// alone never commits more than this.
        let directLimit: Int
        private var bytes: [UInt8] = []
        private var start = 0
        private var direct: DirectFrame?
        /// Whether the last frame was read straight into its buffers.
        private var lastWasDirect = false

        /// A large frame being read into its components' buffers.
        private struct DirectFrame {
            let kind: Kind
            let id: UInt32
            let sequence: UInt64
            /// The record's length: what the frame holds in memory.
            let recordLength: Int
            var components: [[UInt8]]
            /// The component being filled, and how much of it is.
            var index = 0
            var filled = 0

            var isComplete: Bool { index == components.count }

            /// Moves past the components already full (and empty ones).
            mutating func settle() {
                while index < components.count && filled == components[index].count {
                    index += 1
                    filled = 0
                }
            }
        }

        /// Frames of 32 KiB or more are read straight into their buffers,
        /// up to `directLimit` (4 MiB unless given).
        static let defaultDirectThreshold = 32 << 10

        init(_ format: PortWireFormat = .spindle, directThreshold: Int = defaultDirectThreshold, directLimit: Int = 4 << 20) {
            self.format = format
            self.directThreshold = directThreshold
            self.directLimit = directLimit
        }

        /// Whether part of a frame is buffered (end of stream now would
        /// truncate it).
        var hasPartialFrame: Bool { direct != nil || start < bytes.count }

        /// Bytes held for a partial frame (0 with none): what counts
        /// against `NetworkPort.partialFrameMemoryLimit`. A frame read
        /// straight into its buffers counts whole: they are allocated.
        var partialFrameBytes: Int {
            if let direct { return direct.recordLength }
            return start < bytes.count ? bytes.count : 0
        }

        /// How many bytes the caller's next read should ask for, if fewer
        /// than its buffer holds: after a frame read straight into its
        /// buffers, with nothing buffered, just a header with a one-entry
        /// component table, so that if another large frame follows, its
        /// bytes go straight into its buffers rather than through the
        /// caller's (at the cost of one more read per frame).
        var nextReadLimit: Int? {
            lastWasDirect && direct == nil && start == bytes.count ? 4 + headerSize + componentSize : nil
        }

        mutating func append(_ chunk: UnsafeRawBufferPointer) {
            require(direct == nil, "PortWire.FrameReader.append: bytes appended while a frame is read straight into its buffers (readDirect)")
            if start > 0 && start >= bytes.count / 2 {
                bytes.removeSubrange(0..<start)
                start = 0
            }
            bytes.append(contentsOf: chunk)
        }

        /// While a large frame is being read straight into its buffers:
        /// calls `read` with the rest of the buffer being filled, takes the
        /// bytes it read, and returns what it returned. Nil when no such
        /// frame is under way: the caller reads into its own buffer and
        /// `append`s.
        mutating func readDirect(_ read: (UnsafeMutableRawBufferPointer) -> PortSocketCalls.StreamRead) -> PortSocketCalls.StreamRead? {
            guard direct != nil, !direct!.isComplete else { return nil }
            let index = direct!.index
            let filled = direct!.filled
            let result = direct!.components[index].withUnsafeMutableBytes { b in
                read(UnsafeMutableRawBufferPointer(rebasing: b[filled...]))
            }
            if case .bytes(let n) = result {
                direct!.filled += n
                direct!.settle()
            }
            return result
        }

        /// The next whole frame, if one is here.
        mutating func next() throws(PortError) -> Frame? {
            if let frame = direct {
                guard frame.isComplete else { return nil }
                direct = nil
                lastWasDirect = true
                let envelope = PortEnvelope(id: frame.id, components: frame.components.map { .bytes($0) })
                return .decoded(Decoded(kind: frame.kind, sequence: frame.sequence, envelope: envelope))
            }
            guard let (offset, length) = try nextBounds() else { return nil }
            lastWasDirect = false
            let frame = Array(bytes[offset..<(offset + length)])
            start = offset + length
            if start == bytes.count {
                bytes.removeAll(keepingCapacity: bytes.count <= 1 << 20)
                start = 0
            }
            return .record(frame)
        }

        /// Where the next whole frame's bytes lie, once they are all buffered.
        /// For a large `.spindle` frame whose header and component table are
        /// here but not the rest, starts reading it straight into its
        /// buffers (and returns nil: the caller reads on).
        private mutating func nextBounds() throws(PortError) -> (offset: Int, length: Int)? {
            let available = bytes.count - start
            switch format {
            case .spindle:
                guard available >= 4 else { return nil }
                let length = bytes.withUnsafeBytes { Int(PortWire.load(UInt32.self, $0, start)) }
                guard length >= headerSize else { throw .malformed("a frame of \(length) bytes is shorter than a header") }
                guard length <= maximumFrameRecord else {
                    throw .malformed("a frame of \(length) bytes is over the limit of \(maximumFrameRecord)")
                }
                if available - 4 >= length { return (start + 4, length) }
                // The header is checked as soon as it is here, not once the
                // whole frame is: a peer that announces a large frame of
                // garbage is closed before it is buffered.
                if available - 4 >= headerSize,
                   let problem = bytes.withUnsafeBytes({ PortWire.headerProblem($0, at: start + 4, length: length) }) {
                    throw problem
                }
                if length >= directThreshold && length <= directLimit { try startDirect(length: length) }
                return nil
            case .foundationSocketPort:
                guard available >= 8 else { return nil }
                let (magic, length) = FoundationPortWire.prefix(bytes, at: start)
                guard magic == FoundationPortWire.magic else { throw .malformed("bad magic number") }
                guard length >= FoundationPortWire.minimumFrameSize else {
                    throw .malformed("a frame of \(length) bytes is shorter than a header")
                }
                guard length <= FoundationPortWire.maximumFrameSize else {
                    throw .malformed("a frame of \(length) bytes is over the limit of \(FoundationPortWire.maximumFrameSize)")
                }
                return available >= length ? (start, length) : nil
            }
        }

        /// With a frame of `length` (the record's) partly buffered from
        /// `start`, its header checked by `headerProblem`: once its
        /// component table is here too, checks it as `decode` would, makes
        /// the components' buffers, moves the buffered bytes into them and
        /// empties the staging buffer.
        private mutating func startDirect(length: Int) throws(PortError) {
            let available = bytes.count - start - 4
            guard available >= headerSize else { return }
            let record = start + 4
            let (rawKind, id, count, sequence) = bytes.withUnsafeBytes { b in
                (b[record + 4], PortWire.load(UInt32.self, b, record + 8), Int(PortWire.load(UInt32.self, b, record + 12)),
                 PortWire.load(UInt64.self, b, record + 16))
            }
            let tableEnd = headerSize + componentSize * count
            guard available >= tableEnd else { return }
            guard let kind = Kind(rawValue: rawKind) else { throw .malformed("unknown record kind \(rawKind)") }
            var lengths: [Int] = []
            lengths.reserveCapacity(count)
            var offset = tableEnd
            for i in 0..<count {
                let entry = record + headerSize + componentSize * i
                let (componentKind, componentLength) = bytes.withUnsafeBytes { b in
                    (b[entry], Int(PortWire.load(UInt32.self, b, entry + 4)))
                }
                switch componentKind {
                case 0: break
                case 1, 2: throw .malformed("component \(i) lacks its descriptor")
                case 3: throw .malformed("component \(i) is in a ring, which only a named port's connection takes")
                case let other: throw .malformed("component \(i) has unknown kind \(other)")
                }
                guard offset + componentLength <= length else { throw .malformed("component \(i) runs past the record's end") }
                offset += componentLength
                lengths.append(componentLength)
            }
            guard offset == length else { throw .malformed("\(length - offset) bytes after the last component") }
            guard length - tableEnd <= PortEnvelope.maximumByteCount else {
                throw .malformed("over \(PortEnvelope.maximumByteCount) bytes")
            }
            var frame = DirectFrame(
                kind: kind, id: id, sequence: sequence, recordLength: length,
                components: lengths.map { [UInt8](repeating: 0, count: $0) })
            // The component bytes that came with the header.
            var from = record + tableEnd
            frame.settle()
            while from < bytes.count {
                let take = min(bytes.count - from, frame.components[frame.index].count - frame.filled)
                let filled = frame.filled
                frame.components[frame.index].withUnsafeMutableBytes { target in
                    bytes.withUnsafeBytes { source in
                        UnsafeMutableRawBufferPointer(rebasing: target[filled..<(filled + take)])
                            .copyMemory(from: UnsafeRawBufferPointer(rebasing: source[from..<(from + take)]))
                    }
                }
                from += take
                frame.filled += take
                frame.settle()
            }
            bytes.removeAll(keepingCapacity: bytes.count <= 1 << 20)
            start = 0
            direct = frame
        }
    }

    /// The checks of `decode` that a record's header alone allows, for a
    /// frame still arriving: its magic number, kind, and component count,
    /// and that the component table fits the announced length. Nil if
    /// they pass.
    static func headerProblem(_ b: UnsafeRawBufferPointer, at offset: Int, length: Int) -> PortError? {
        guard load(UInt32.self, b, offset) == magic else { return .malformed("bad magic number") }
        guard let kind = Kind(rawValue: b[offset + 4]) else { return .malformed("unknown record kind \(b[offset + 4])") }
        guard kind != .ring else { return .malformed("a ring, which only a named port's connection takes") }
        let componentCount = Int(load(UInt32.self, b, offset + 12))
        guard componentCount <= PortEnvelope.maximumComponentCount else {
            return .malformed("\(componentCount) components, over the limit of \(PortEnvelope.maximumComponentCount)")
        }
        guard headerSize + componentSize * componentCount <= length else {
            return .malformed("the component table runs past the record's end")
        }
        return nil
    }

    /// Decodes a record read from a stream (no descriptors).
    static func decode(frame record: [UInt8]) throws(PortError) -> Decoded {
        let result: Result<Decoded, PortError> = record.withUnsafeBytes { b in
            do throws(PortError) {
                return .success(try decode(b, count: b.count, fds: []))
            } catch {
                return .failure(error)
            }
        }
        return try result.get()
    }

    /// The record that introduces a sender's ring `id` (its memfd goes with
    /// it, as the record's one descriptor).
    static func ringIntroduction(id: UInt64) -> [UInt8] {
        var bytes = bare(.ring)
        withUnsafeBytes(of: id.littleEndian) { bytes.replaceSubrange(16..<24, with: $0) }
        return bytes
    }

    /// A header-only record (welcome, refused).
    static func bare(_ kind: Kind) -> [UInt8] {
        var bytes: [UInt8] = []
        append(magic, to: &bytes)
        bytes += [kind.rawValue, 0, 0, 0]
        append(UInt32(0), to: &bytes)
        append(UInt32(0), to: &bytes)
        append(UInt64(0), to: &bytes)
        return bytes
    }

    private static func append<T: FixedWidthInteger>(_ value: T, to bytes: inout [UInt8]) {
        withUnsafeBytes(of: value.littleEndian) { bytes += $0 }
    }

    fileprivate static func load<T: FixedWidthInteger>(_ type: T.Type, _ buffer: UnsafeRawBufferPointer, _ offset: Int) -> T {
        T(littleEndian: buffer.loadUnaligned(fromByteOffset: offset, as: T.self))
    }
}
