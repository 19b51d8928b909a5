@testable import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// The inode a descriptor refers to, or nil if it is not open. Telling
/// "closed" by the inode, not by an error: in a process whose other tests
/// open files, a closed number may be taken again at once.
private func inode(_ fd: Int32) -> UInt? {
    var info = stat()
    return fstat(fd, &info) == 0 ? UInt(info.st_ino) : nil
}

/// Whether the peer of a connected socket reads the end of the stream.
private func peerSeesTheEnd(_ peer: Int32) -> Bool {
    var byte: UInt8 = 0
    return recv(peer, &byte, 1, Int32(MSG_DONTWAIT)) == 0
}

/// A listening port's socket (`PortDescriptor`): closed from any thread,
/// it is shut down at once but closed only once no call uses it.
@Suite struct PortDescriptorTests {
    @Test func withoutUsersCloseClosesAtOnce() throws {
        let (mine, peer) = try PortSocketCalls.socketPair()
        defer { close(peer) }
        let socket = PortDescriptor(mine)
        let original = inode(mine)
        #expect(original != nil)
        socket.close()
        #expect(peerSeesTheEnd(peer))
        #expect(inode(mine) != original, "still open after close() with no user")
        #expect(socket.use { _ in true } == nil, "a use after close() ran")
        socket.close()  // again: nothing
    }

    @Test func aCloseDuringAUseWaitsForItsEnd() throws {
        let (mine, peer) = try PortSocketCalls.socketPair()
        defer { close(peer) }
        let socket = PortDescriptor(mine)
        let original = inode(mine)
        let inside: (shutDown: Bool, open: Bool)? = socket.use { fd in
            socket.close()  // as another thread's invalidation would
            let nested = socket.use { _ in true }
            #expect(nested == nil, "a use began after close()")
            return (peerSeesTheEnd(peer), inode(fd) == original)
        }
        #expect(inside?.shutDown == true, "close() did not shut the socket down at once")
        #expect(inside?.open == true, "close() closed the descriptor under its user")
        #expect(inode(mine) != original, "the last user's way out did not close it")
    }

    /// Four threads use the socket over and over while the main thread
    /// closes it: every call that got in finds the descriptor still the
    /// socket's, and once all have left it is closed.
    @Test func usersRacingACloseNeverSeeItClosed() throws {
        for _ in 0..<50 {
            let (mine, peer) = try PortSocketCalls.socketPair()
            let socket = PortDescriptor(mine)
            let original = inode(mine)
            let lost = LockedValue(0)
            let started = LockedValue(0)
            let users = try (0..<4).map { _ in
                try NativeThread.start {
                    started.withLock { $0 += 1 }
                    while let stillOurs = socket.use({ fd in inode(fd) == original }) {
                        if !stillOurs { lost.withLock { $0 += 1 } }
                    }
                }
            }
            while started.withLock({ $0 }) < 4 { sched_yield() }
            socket.close()
            for user in users { try user.join() }
            #expect(lost.withLock { $0 } == 0)
            #expect(inode(mine) != original)
            close(peer)
        }
    }
}
