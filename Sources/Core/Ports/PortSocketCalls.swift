import CShims

#if canImport(Glibc)
import Glibc
#endif

/// The system calls of `NamedPort` and `RemotePort`, and how their errors
/// become `PortError`s: the one place in Ports that reads an errno.
///
/// errno is sorted once: a peer that went away (EPIPE, ECONNRESET,
/// ENOTCONN) is `.peerGone`; no listener at a name (ECONNREFUSED) is
/// `.nameNotFound`, a name in use `.nameTaken` (with its owner, if a probe
/// can tell); a TCP address in use is `.addressInUse`, and a TCP connect
/// that fails at the other end `.connectionFailed` with its errno; what the
/// environment refused (EMFILE, ENOMEM, ENOBUFS...) is `.system`.
enum PortSocketCalls {
    /// The abstract-namespace name a port named `name` of user `uid` is
    /// published under: `spindle.<uid>.<name>`. The user id keeps users'
    /// names apart; it proves nothing (anyone may bind any abstract name),
    /// which is why both ends check the other's credentials.
    static func address(_ name: String, owner uid: UInt32) -> [UInt8] {
        Array("spindle.\(uid).\(name)".utf8)
    }

    /// The longest port name: sun_path holds 108 bytes, one of them the
    /// abstract namespace's leading NUL, and `spindle.<uid>.` takes up to 19.
    static let maximumNameLength = 88

    static func checkName(_ name: String, _ api: String) {
        require(!name.isEmpty, "\(api): the port name is empty")
        require(!name.utf8.contains(0), "\(api): the port name contains a NUL byte")
        require(
            name.utf8.count <= maximumNameLength,
            "\(api): the port name is \(name.utf8.count) bytes; at most \(maximumNameLength) fit in a socket address")
    }

    static var effectiveUID: UInt32 { cshims_port_effective_uid() }

    static func listen(_ name: String) throws(PortError) -> Int32 {
        let address = address(name, owner: effectiveUID)
        // The backlog bounds connections waiting for the owner's loop to
        // accept them; the kernel caps it at net.core.somaxconn.
        let fd = address.withUnsafeBufferPointer { cshims_port_listen($0.baseAddress, $0.count, 128) }
        if fd >= 0 { return fd }
        if -fd == EADDRINUSE { throw .nameTaken(name, owner: owner(of: address)) }
        throw environment("listen", -fd)
    }

    /// Who holds the abstract name `address`: the credentials the kernel
    /// reports for a probe connection's peer, the owner's listening socket.
    /// nil if the probe cannot connect without waiting (the owner's backlog
    /// is full, or nobody holds the name any more). The probe is closed at
    /// once; the owner sees a connection that ends without a message.
    private static func owner(of address: [UInt8]) -> PortOwner? {
        let fd = address.withUnsafeBufferPointer { cshims_port_connect($0.baseAddress, $0.count, 0) }
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var pid: Int32 = 0
        var uid: UInt32 = 0
        var gid: UInt32 = 0
        guard cshims_port_peer_credentials(fd, &pid, &uid, &gid) == 0 else { return nil }
        // The kernel reports pid 0 for a process in a PID namespace this
        // one cannot see.
        return PortOwner(uid: uid, pid: pid > 0 ? pid : nil)
    }

    /// Connects to the name, waiting until `deadline` at most for room in
    /// the owner's backlog (full while its loop does not accept).
    static func connect(_ name: String, owner uid: UInt32, before deadline: MonotonicClock.Instant) throws(PortError) -> Int32 {
        let start = MonotonicClock.now
        let address = address(name, owner: uid)
        // Zero means "do not wait" to the shim: a deadline that has passed
        // still gets one try.
        let timeout = remainingNanoseconds(until: deadline)
        let fd = address.withUnsafeBufferPointer { cshims_port_connect($0.baseAddress, $0.count, timeout) }
        if fd >= 0 { return fd }
        switch -fd {
        case ECONNREFUSED, ENOENT: throw .nameNotFound(name)
        case EAGAIN: throw .timedOut(after: start.duration(to: .now))
        default: throw environment("connect", -fd)
        }
    }

    enum Accepted {
        case connection(Int32)
        /// None waits (or the listener was shut down).
        case none
        /// The process or the system is out of descriptors or memory
        /// (errno `code`): the connection stays queued.
        case exhausted(code: Int32)
    }

    /// A waiting connection, if any. A connection that failed before it was
    /// accepted (ECONNABORTED, EPROTO, EPERM) is skipped.
    static func accept(_ fd: Int32) -> Accepted {
        while true {
            let conn = cshims_port_accept(fd)
            if conn >= 0 { return .connection(conn) }
            switch -conn {
            case ECONNABORTED, EPROTO, EPERM: continue
            case EMFILE, ENFILE, ENOBUFS, ENOMEM: return .exhausted(code: -conn)
            default: return .none
            }
        }
    }

    static func socketPair() throws(PortError) -> (Int32, Int32) {
        var fds: [Int32] = [-1, -1]
        let rc = fds.withUnsafeMutableBufferPointer { cshims_port_socketpair($0.baseAddress) }
        if rc < 0 { throw environment("socketpair", -rc) }
        return (fds[0], fds[1])
    }

    /// The user id of the process at the other end (as of its connect).
    static func peerUID(_ fd: Int32) throws(PortError) -> UInt32 {
        var pid: Int32 = 0
        var uid: UInt32 = 0
        var gid: UInt32 = 0
        let rc = cshims_port_peer_credentials(fd, &pid, &uid, &gid)
        if rc < 0 { throw environment("getsockopt(SO_PEERCRED)", -rc) }
        return uid
    }

    static func duplicate(_ fd: Int32) throws(PortError) -> Int32 {
        let copy = cshims_port_duplicate(fd)
        if copy < 0 { throw environment("fcntl(F_DUPFD_CLOEXEC)", -copy) }
        return copy
    }

    static func close(_ fd: Int32) { _ = cshims_port_close(fd) }

    static func close(_ fds: [Int32]) { for fd in fds { close(fd) } }

    static func shutdown(_ fd: Int32) { _ = cshims_port_shutdown(fd) }

    /// Sends one record with `fds`, waiting for room in the socket buffer
    /// until `deadline`.
    static func send(_ fd: Int32, _ bytes: [UInt8], fds: [Int32], before deadline: MonotonicClock.Instant) throws(PortError) {
        let start = MonotonicClock.now
        while true {
            let rc = bytes.withUnsafeBytes { b in
                fds.withUnsafeBufferPointer { f in
                    cshims_port_send(fd, b.baseAddress, b.count, f.baseAddress, Int32(f.count))
                }
            }
            if rc >= 0 { return }
            switch -Int32(rc) {
            case EAGAIN:
                let now = MonotonicClock.now
                if now >= deadline { throw .timedOut(after: now - start) }
                _ = cshims_port_poll(fd, 2, remainingNanoseconds(until: deadline))
            case EPIPE, ECONNRESET, ENOTCONN, ECONNREFUSED:
                throw .peerGone
            case let code:
                throw environment("sendmsg", code)
            }
        }
    }

    enum Received {
        /// A record of `count` bytes, with the descriptors it carried;
        /// `truncated` if it (or its descriptors) did not fit.
        case record(count: Int, fds: [Int32], truncated: Bool)
        /// Nothing waits.
        case nothing
        /// The peer closed its end, or the connection failed.
        case closed
    }

    /// Receives one record into `buffer`, never waiting.
    static func receive(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer) -> Received {
        var fds = [Int32](repeating: -1, count: Int(CSHIMS_PORT_MAX_FDS))
        var count: Int32 = 0
        var truncated: Int32 = 0
        let rc = fds.withUnsafeMutableBufferPointer { f in
            cshims_port_receive(fd, buffer.baseAddress, buffer.count, f.baseAddress, Int32(f.count), &count, &truncated)
        }
        if rc < 0 { return -Int32(rc) == EAGAIN ? .nothing : .closed }
        let received = Array(fds.prefix(Int(count)))
        if rc == 0 && count == 0 { return .closed }
        return .record(count: rc, fds: received, truncated: truncated != 0)
    }

    /// Waits until `fd` is readable (or hung up) or `deadline` passes.
    /// Returns false on the deadline.
    static func waitReadable(_ fd: Int32, before deadline: MonotonicClock.Instant) -> Bool {
        while true {
            if cshims_port_poll(fd, 1, remainingNanoseconds(until: deadline)) == 1 { return true }
            if MonotonicClock.now >= deadline { return false }
        }
    }

    // MARK: TCP

    static func tcpListen(host: String, port: UInt16) throws(PortError) -> (fd: Int32, port: UInt16) {
        var bound: UInt16 = 0
        let fd = cshims_port_tcp_listen(host, port, 128, &bound)
        if fd >= 0 { return (fd, bound) }
        if -fd == EADDRINUSE { throw .addressInUse(host: host, port: port) }
        if -fd == EINVAL { throw .system(SystemCallError(call: "inet_pton(\(host))", code: EINVAL)) }
        throw environment("bind", -fd)
    }

    static func tcpConnect(host: String, port: UInt16, before deadline: MonotonicClock.Instant) throws(PortError) -> Int32 {
        let start = MonotonicClock.now
        let fd = cshims_port_tcp_connect(host, port, remainingNanoseconds(until: deadline))
        if fd >= 0 { return fd }
        switch -fd {
        // The shim's own wait ran out (it says ETIMEDOUT too): the call's
        // timeout, not the network's.
        case ETIMEDOUT where MonotonicClock.now >= deadline: throw .timedOut(after: start.duration(to: .now))
        case EINVAL: throw .system(SystemCallError(call: "inet_pton(\(host))", code: EINVAL))
        // This process or the system ran out of something: not the peer's doing.
        case EMFILE, ENFILE, ENOBUFS, ENOMEM: throw environment("connect", -fd)
        default: throw .connectionFailed(host: host, port: port, code: -fd)
        }
    }

    static func tcpNoDelay(_ fd: Int32) { _ = cshims_port_tcp_nodelay(fd) }

    /// Writes all of `bytes` to a stream, waiting for room until `deadline`.
    /// A timeout after part of it was written leaves the stream mid-frame:
    /// the caller must close it.
    static func streamSendAll(_ fd: Int32, _ bytes: [UInt8], before deadline: MonotonicClock.Instant) throws(PortError) {
        let start = MonotonicClock.now
        var sent = 0
        while sent < bytes.count {
            let rc = bytes.withUnsafeBytes { cshims_port_stream_send(fd, $0.baseAddress! + sent, $0.count - sent) }
            if rc >= 0 {
                sent += rc
                continue
            }
            try streamWriteFailed(fd, code: -Int32(rc), sent: sent, since: start, before: deadline, call: "send")
        }
    }

    /// Writes `head` and then each of `parts` to a stream, as one run of
    /// bytes, straight from those buffers (gathering writes, no copy),
    /// waiting for room until `deadline`. As `streamSendAll(_:_:before:)`,
    /// a timeout after part of it was written ends the stream.
    static func streamSendAll(_ fd: Int32, head: [UInt8], parts: [[UInt8]], before deadline: MonotonicClock.Instant) throws(PortError) {
        var buffers: [UnsafeRawBufferPointer] = []
        buffers.reserveCapacity(1 + parts.count)
        // Each buffer's address is valid inside its own withUnsafeBytes:
        // nest one call per buffer and send from the innermost.
        func gather(_ i: Int) -> PortError? {
            if i == parts.count {
                do throws(PortError) {
                    try streamSendAll(fd, buffers, before: deadline)
                    return nil
                } catch {
                    return error
                }
            }
            return parts[i].withUnsafeBytes { b in
                buffers.append(b)
                return gather(i + 1)
            }
        }
        let failure = head.withUnsafeBytes { b in
            buffers.append(b)
            return gather(0)
        }
        if let failure { throw failure }
    }

    /// Writes `buffers` in order, at most `CSHIMS_PORT_MAX_IOV` per call.
    private static func streamSendAll(_ fd: Int32, _ buffers: [UnsafeRawBufferPointer], before deadline: MonotonicClock.Instant) throws(PortError) {
        let start = MonotonicClock.now
        let total = buffers.reduce(0) { $0 + $1.count }
        let maximum = Int(CSHIMS_PORT_MAX_IOV)
        var sent = 0
        var index = 0
        var offset = 0
        while sent < total {
            while index < buffers.count && offset == buffers[index].count {
                index += 1
                offset = 0
            }
            let count = min(maximum, buffers.count - index)
            let rc = withUnsafeTemporaryAllocation(of: UnsafeRawPointer?.self, capacity: count) { bases in
                withUnsafeTemporaryAllocation(of: Int.self, capacity: count) { lengths in
                    for i in 0..<count {
                        let b = buffers[index + i]
                        let skip = i == 0 ? offset : 0
                        bases[i] = b.baseAddress.map { UnsafeRawPointer($0 + skip) }
                        lengths[i] = b.count - skip
                    }
                    return cshims_port_stream_sendv(fd, bases.baseAddress, lengths.baseAddress, Int32(count))
                }
            }
            if rc >= 0 {
                sent += rc
                var left = rc
                while left > 0 {
                    let rest = buffers[index].count - offset
                    if left >= rest {
                        left -= rest
                        index += 1
                        offset = 0
                    } else {
                        offset += left
                        left = 0
                    }
                }
                continue
            }
            try streamWriteFailed(fd, code: -Int32(rc), sent: sent, since: start, before: deadline, call: "sendmsg")
        }
    }

    /// After a stream write (`call`, for the error) failed with `code`:
    /// on EAGAIN waits for room until `deadline`, and past it ends the
    /// stream if part of a frame went out (`sent` bytes: the stream is out
    /// of step for good) and throws `.timedOut`; a lost peer is
    /// `.peerGone`; anything else is the environment's error.
    private static func streamWriteFailed(
        _ fd: Int32, code: Int32, sent: Int, since start: MonotonicClock.Instant,
        before deadline: MonotonicClock.Instant, call: String
    ) throws(PortError) {
        switch code {
        case EAGAIN:
            let now = MonotonicClock.now
            if now >= deadline {
                if sent > 0 { shutdown(fd) }
                throw .timedOut(after: now - start)
            }
            _ = cshims_port_poll(fd, 2, remainingNanoseconds(until: deadline))
        case EPIPE, ECONNRESET, ENOTCONN, ETIMEDOUT, EHOSTUNREACH, ENETUNREACH:
            throw .peerGone
        default:
            throw environment(call, code)
        }
    }

    enum StreamWrite {
        /// This many bytes went out (possibly fewer than offered).
        case sent(Int)
        /// The socket buffer is full.
        case full
        /// The peer is gone, or the connection failed.
        case failed(PortError)
    }

    /// One write of `bytes` to a stream, never waiting.
    static func streamSendSome(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) -> StreamWrite {
        let rc = cshims_port_stream_send(fd, bytes.baseAddress, bytes.count)
        if rc >= 0 { return .sent(rc) }
        switch -Int32(rc) {
        case EAGAIN: return .full
        case EPIPE, ECONNRESET, ENOTCONN, ETIMEDOUT, EHOSTUNREACH, ENETUNREACH: return .failed(.peerGone)
        case let code: return .failed(environment("send", code))
        }
    }

    enum StreamRead {
        case bytes(Int)
        case nothing
        case closed
    }

    static func streamReceive(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer) -> StreamRead {
        let rc = cshims_port_stream_receive(fd, buffer.baseAddress, buffer.count)
        if rc > 0 { return .bytes(rc) }
        if rc == 0 { return .closed }
        return -Int32(rc) == EAGAIN ? .nothing : .closed
    }

    static func sealedMemfd(_ bytes: [UInt8]) throws(PortError) -> Int32 {
        let fd = bytes.withUnsafeBytes { cshims_port_sealed_memfd($0.baseAddress, $0.count) }
        if fd < 0 { throw environment("memfd_create", -fd) }
        return fd
    }

    /// The contents of a sealed memfd of `count` bytes; nil if it is not
    /// sealed or not that size.
    static func readSealedMemfd(_ fd: Int32, count: Int) -> [UInt8]? {
        var failed = false
        let bytes = [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
            failed = cshims_port_read_sealed_memfd(fd, buffer.baseAddress, count) != 0
            initialized = failed ? 0 : count
        }
        return failed ? nil : bytes
    }

    private static func remainingNanoseconds(until deadline: MonotonicClock.Instant) -> Int64 {
        if deadline.isDistantFuture { return -1 }
        return max(0, deadline.nanoseconds - MonotonicClock.now.nanoseconds)
    }

    /// A refusal by the environment; a bad descriptor or address is a bug
    /// in Spindle and stops the process.
    private static func environment(_ call: String, _ code: Int32) -> PortError {
        if code == EBADF || code == EFAULT || code == ENOTSOCK {
            misuse("Ports: \(call) failed with \(errnoDescription(code)); a port's descriptor was lost")
        }
        return .system(SystemCallError(call: call, code: code))
    }
}
