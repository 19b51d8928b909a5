/// The bytes a `NetworkPort` and a `RemotePort` connected to it exchange
/// over TCP. Both ends of a connection must use the same one; it is chosen
/// when the port is made (`NetworkPort(host:port:wireFormat:_:)`,
/// `RemotePort.connect(host:port:wireFormat:timeout:)`) and never changes.
///
/// ## `.spindle`
///
/// Spindle's own framing, the default: every message kind (one-way,
/// request, reply), any size up to `PortEnvelope.maximumByteCount`. See
/// `NetworkPort`.
///
/// ## `.foundationSocketPort`
///
/// The frames of swift-corelibs-foundation's `SocketPort` over TCP, so that
/// a Spindle program and a Foundation program on Linux exchange messages
/// both ways. Each message is one frame; every integer is big-endian:
///
///     header, 12 bytes
///       0  magic            u32  0xD0CF50C0
///       4  frame length     u32  the whole frame, header included
///       8  message id       u32  PortEnvelope.id (Foundation's msgid)
///     the destination's "signature", 4 + n bytes
///      12  protocol family  u8   PF_INET, 2
///      13  socket type      u8   SOCK_STREAM, 1
///      14  protocol         u8   IPPROTO_TCP, 6
///      15  address length   u8   n: 16 for an IPv4 address
///      16  address          n bytes, a sockaddr_in as laid out on Darwin:
///                           length 16, family 2, TCP port (network order),
///                           IPv4 address, 8 zero bytes
///     then per component, back to back until the frame's end
///       0  type             u32  1 = byte buffer (2 = a port's signature)
///       4  length           u32  bytes that follow
///       8  the bytes
///
/// What Spindle sends: one frame per message, the signature naming the
/// port it connected to (host and TCP port), as Foundation's sender does,
/// byte buffers only. What it reads: the magic and length (anything else
/// there is malformed), the message id and the components; it skips the
/// signature (Foundation puts the *destination's* address there, never the
/// sender's, so it is no reply address). There is no connection
/// handshake: the first frame follows the TCP connect.
///
/// So in this format:
/// - Messages are one-way. Foundation's `SocketPort` never reads replies on
///   the connection it sent on and never transmits a reply port: a
///   `NetworkPort`'s handler result is ignored, and
///   `RemotePort.sendRequest` throws
///   `PortError.unsupportedByFoundationWireFormat`. To answer a Foundation
///   program, connect a `RemotePort` in this format to its listening
///   `SocketPort`.
/// - Only byte buffers travel. An envelope with a port (`.port`,
///   `.remotePort`, a `replyPort`) throws
///   `.unsupportedByFoundationWireFormat` and nothing is sent; an incoming
///   port component (type 2) is an error on its connection.
/// - Spindle's side has no size quirks: frames are reassembled however
///   the stream cuts them, any size up to the envelope limits arrives
///   whole, and several frames in one read are all delivered; a malformed
///   or truncated frame closes only its connection, as with `.spindle`.
/// - Foundation's receiver on Linux has faults that Spindle's sender does
///   not work around, because the bytes it sends are correct: it drops a
///   message whose components with their headers take under 20 bytes
///   (no buffer, or one under 12 bytes), drops a frame longer than one
///   32,768-byte socket read (one buffer over 32,728 bytes), and traps when
///   one read holds more than one frame. A Spindle program sending to
///   Foundation should keep each message between 12 bytes and 32 KB and
///   send the next one only after an application-level acknowledgement.
///   Foundation's sender has none of these limits.
public enum PortWireFormat: Sendable, Hashable {
    /// Spindle's own framing (every message kind; ports stay local).
    case spindle
    /// Foundation's `SocketPort` frames: one-way byte-buffer messages.
    case foundationSocketPort
}
