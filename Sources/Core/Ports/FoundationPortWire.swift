/// Foundation `SocketPort` frames (`PortWireFormat.foundationSocketPort`,
/// whose doc comment has the layout): encoding a `PortEnvelope` into one,
/// and decoding one that `PortWire.FrameReader` cut from a stream.
enum FoundationPortWire {
    static let magic: UInt32 = 0xD0CF_50C0
    static let headerSize = 12
    /// The signature's own header: family, type, protocol, address length.
    static let signatureHeaderSize = 4
    static let componentHeaderSize = 8
    /// The smallest well-formed frame: a header and an empty signature.
    static let minimumFrameSize = headerSize + signatureHeaderSize
    /// The largest frame accepted: the largest signature (its length is one
    /// byte), a full component table and the most bytes an envelope may hold.
    static let maximumFrameSize =
        minimumFrameSize + 255 + componentHeaderSize * PortEnvelope.maximumComponentCount + PortEnvelope.maximumByteCount

    private enum ComponentType: UInt32 {
        case data = 1
        case port = 2
    }

    /// The signature of the TCP port at `host` (a dotted IPv4 address) and
    /// `port`, as a Foundation sender writes it for its destination:
    /// PF_INET, SOCK_STREAM, IPPROTO_TCP and a Darwin `sockaddr_in`.
    static func signature(host: String, port: UInt16) -> [UInt8] {
        // The host was accepted by inet_pton before this is called, so it
        // has four decimal parts; anything else would leave 0.0.0.0, which a
        // Foundation receiver replaces with the peer's address anyway.
        let parts = host.split(separator: ".").compactMap { UInt8($0) }
        let address = parts.count == 4 ? parts : [0, 0, 0, 0]
        let darwinSockaddrIn: [UInt8] = [16, 2, UInt8(port >> 8), UInt8(port & 0xff)] + address + [0, 0, 0, 0, 0, 0, 0, 0]
        return [2, 1, 6, UInt8(darwinSockaddrIn.count)] + darwinSockaddrIn
    }

    /// One frame carrying `envelope` to the port whose signature is
    /// `destination`. Throws, with nothing sent, for an envelope over its
    /// limits or holding a port.
    static func frame(_ envelope: PortEnvelope, destination: [UInt8]) throws(PortError) -> [UInt8] {
        try envelope.checkLimits()
        if envelope.replyPort != nil { throw .unsupportedByFoundationWireFormat("a reply port") }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(headerSize + destination.count + componentHeaderSize * envelope.components.count + envelope.byteCount)
        append(magic, to: &bytes)
        append(UInt32(0), to: &bytes)  // the length, set below
        append(envelope.id, to: &bytes)
        bytes += destination
        for component in envelope.components {
            guard case .bytes(let b) = component else { throw .unsupportedByFoundationWireFormat("a port component") }
            append(ComponentType.data.rawValue, to: &bytes)
            append(UInt32(b.count), to: &bytes)
            bytes += b
        }
        withUnsafeBytes(of: UInt32(bytes.count).bigEndian) { length in
            for i in 0..<4 { bytes[4 + i] = length[i] }
        }
        return bytes
    }

    /// The magic number and frame length at `offset` of `bytes` (at least 8
    /// bytes there).
    static func prefix(_ bytes: [UInt8], at offset: Int) -> (magic: UInt32, length: Int) {
        bytes.withUnsafeBytes { (load($0, offset), Int(load($0, offset + 4))) }
    }

    /// Decodes a whole frame (its length field already checked against
    /// `frame.count` by the frame reader). A port component, an unknown
    /// component type or a component that runs past the end is malformed.
    static func decode(_ frame: [UInt8]) throws(PortError) -> PortEnvelope {
        let count = frame.count
        let signatureEnd = minimumFrameSize + Int(frame[minimumFrameSize - 1])
        guard signatureEnd <= count else { throw .malformed("the sender's signature runs past the frame's end") }
        let id: UInt32 = frame.withUnsafeBytes { load($0, 8) }
        var components: [PortEnvelope.Component] = []
        var total = 0
        var offset = signatureEnd
        while offset < count {
            let i = components.count
            guard i < PortEnvelope.maximumComponentCount else {
                throw .malformed("over \(PortEnvelope.maximumComponentCount) components")
            }
            guard count - offset >= componentHeaderSize else { throw .malformed("component \(i)'s header is cut short") }
            let (type, length): (UInt32, Int) = frame.withUnsafeBytes { (load($0, offset), Int(load($0, offset + 4))) }
            offset += componentHeaderSize
            guard length <= count - offset else { throw .malformed("component \(i) runs past the frame's end") }
            switch ComponentType(rawValue: type) {
            case .data:
                total += length
                guard total <= PortEnvelope.maximumByteCount else { throw .malformed("over \(PortEnvelope.maximumByteCount) bytes") }
                components.append(.bytes(Array(frame[offset..<offset + length])))
            case .port:
                throw .malformed("component \(i) is a port, which Spindle does not take in Foundation's SocketPort format")
            case nil:
                throw .malformed("component \(i) has unknown type \(type)")
            }
            offset += length
        }
        return PortEnvelope(id: id, components: components)
    }

    private static func append(_ value: UInt32, to bytes: inout [UInt8]) {
        withUnsafeBytes(of: value.bigEndian) { bytes += $0 }
    }

    private static func load(_ buffer: UnsafeRawBufferPointer, _ offset: Int) -> UInt32 {
        UInt32(bigEndian: buffer.loadUnaligned(fromByteOffset: offset, as: UInt32.self))
    }
}
