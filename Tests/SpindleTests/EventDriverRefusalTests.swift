// The kernel refuses the event driver a descriptor (EMFILE): a loop thread
// that cannot make its backend, and event sources whose first watch needs
// a new epoll instance, eventfd or inotify instance, get an error; nothing
// stops the process. In exit tests: the descriptor limit is lowered in the
// child only, never in the test runner.
#if canImport(Glibc)
import Glibc
#endif
import Spindle
import Testing
import TestSupport

@Suite("Event driver: out of descriptors")
struct EventDriverRefusalTests {
    /// With every descriptor number below the limit in use, `LoopThread.start`
    /// throws `.systemCall` with EMFILE (either backend, and the preferred
    /// one), and read, timer, signal and file-system sources on a work
    /// queue fail with EMFILE and run their cancel handlers; once
    /// descriptors are free again, the next loop thread and sources work.
    @Test func loopThreadsAndFirstSourcesReportEMFILE() async {
        await #expect(processExitsWith: .success) {
            unblockAllSignals()
            armHangAlarm(seconds: 60)
            exit(runOutOfDescriptors())
        }
    }
}

/// Lowers this process's RLIMIT_NOFILE to its lowest free descriptor
/// number, so that the next descriptor made fails with EMFILE; returns the
/// limit to put back.
private func exhaustDescriptors() -> rlimit? {
    var old = rlimit()
    guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &old) == 0 else { return nil }
    let lowest = dup(0)
    guard lowest >= 0 else { return nil }
    close(lowest)
    var lowered = old
    lowered.rlim_cur = rlim_t(lowest)
    guard setrlimit(Int32(RLIMIT_NOFILE.rawValue), &lowered) == 0 else { return nil }
    return old
}

private func isEMFILE(_ failure: EventSourceError?) -> Bool {
    switch failure {
    case .systemCall(let error): error.code == EMFILE
    case .watchFailed(let error): error.code == EMFILE
    default: false
    }
}

/// `loopThreadsAndFirstSourcesReportEMFILE` in its own process: 0, or the
/// failed check.
private func runOutOfDescriptors() -> Int32 {
    signal(SIGUSR1, SIG_IGN)
    var ends: [Int32] = [0, 0]
    guard pipe(&ends) == 0 else { return 2 }
    let path = scratchPath("emfile")
    guard writeFile(path, pattern(4)) else { return 3 }
    defer { unlink(path) }
    let file = open(path, O_RDONLY)
    guard file >= 0 else { return 4 }
    let queue = WorkQueue(label: "emfile")
    _ = queue.sync { 0 }  // the pool's threads exist before the limit drops

    guard var saved = exhaustDescriptors() else { return 5 }
    for kind: EventBackendKind? in [nil, .epoll, .ioUring] {
        do {
            let thread = try LoopThread.start(backend: kind)
            thread.stop()
            try? thread.join()
            return 6
        } catch .systemCall(let error) {
            // io_uring may be refused for its own reason (EPERM under a
            // seccomp profile) before it needs a descriptor.
            guard error.code == EMFILE || (kind == .ioUring && EventBackends.ioUringRefusal != nil) else { return 7 }
        } catch {
            return 8
        }
    }
    var sources: [EventSource] = []
    let cancelled = Semaphore(value: 0)
    func make(_ build: () throws -> EventSource) -> Bool {
        guard let source = try? build() else { return false }
        source.setEventHandler { _ in }
        source.setCancelHandler { _ in cancelled.signal() }
        source.activate()
        sources.append(source)
        return true
    }
    guard make({ try EventSource.read(descriptor: ends[0], on: .queue(queue)) }),
        make({ EventSource.timer(interval: .milliseconds(1), on: .queue(queue)) }),
        make({ try EventSource.signal(SIGUSR1, on: .queue(queue)) }),
        make({ try EventSource.fileSystemObject(descriptor: file, events: .write, on: .queue(queue)) })
    else { return 9 }
    for _ in sources {
        guard cancelled.wait(timeout: .seconds(10)) == .completed else { return 10 }
    }
    for source in sources {
        guard source.isCancelled, isEMFILE(source.failure) else {
            print("\(source): failure \(String(describing: source.failure))")
            return 11
        }
    }

    // Descriptors again: the driver tries again.
    guard setrlimit(Int32(RLIMIT_NOFILE.rawValue), &saved) == 0 else { return 12 }
    guard let thread = try? LoopThread.start() else { return 13 }
    thread.stop()
    try? thread.join()
    let fired = Semaphore(value: 0)
    let again = EventSource.timer(interval: nil, on: .queue(queue))
    again.setEventHandler { _ in fired.signal() }
    again.activate()
    guard fired.wait(timeout: .seconds(10)) == .completed else { return 14 }
    again.cancel()
    return 0
}
