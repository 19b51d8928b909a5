import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

@Suite("Event backends")
struct EventBackendTests {
    @Test func preferredBackendFollowsTheKernel() {
        if EventBackends.ioUringRefusal == nil {
            #expect([EventBackendKind.ioUring, .epoll].contains(EventBackends.preferredKind))
        } else {
            #expect(EventBackends.preferredKind == .epoll)
        }
    }

    /// Waking a loop that is awake costs no system call; waking a sleeping
    /// one costs exactly one.
    @Test(arguments: availableBackends)
    func wakeMakesASyscallOnlyWhenAsleep(kind: EventBackendKind) throws {
        let backend = try EventBackends.makeBackend(kind)
        var events: [ReadyEvent] = []
        // Awake (not in wait): wakes only mark the state.
        for _ in 0..<100 { backend.wake() }
        #expect(backend.statistics.wakeRequests == 100)
        #expect(backend.statistics.wakeSyscalls == 0)
        // The pending wake makes the next wait return at once.
        #expect(backend.wait(until: .distantFuture, events: &events))
        // Asleep: a wake from another thread costs one syscall.
        let box = Unchecked(backend)
        let join = startThread {
            usleep(30_000)
            box.value.wake()
        }
        #expect(backend.wait(until: .now.advanced(by: .seconds(30)), events: &events))
        join()
        #expect(backend.statistics.wakeSyscalls == 1)
    }

    @Test(arguments: availableBackends)
    func waitTimesOutNoEarlier(kind: EventBackendKind) throws {
        let backend = try EventBackends.makeBackend(kind)
        var events: [ReadyEvent] = []
        let start = MonotonicClock.now
        #expect(!backend.wait(until: start.advanced(by: .milliseconds(20)), events: &events))
        #expect(start.duration(to: .now) >= .milliseconds(20))
        #expect(events.isEmpty)
    }

    /// Descriptors are reported once per arming.
    @Test(arguments: availableBackends)
    func descriptorReadinessIsOneShot(kind: EventBackendKind) throws {
        let backend = try EventBackends.makeBackend(kind)
        var fds: [Int32] = [0, 0]
        #expect(pipe(&fds) == 0)
        defer { close(fds[0]); close(fds[1]) }
        try backend.arm(fds[0], for: .readable, token: 42)
        var b: UInt8 = 1
        _ = write(fds[1], &b, 1)
        var events: [ReadyEvent] = []
        _ = backend.wait(until: .now.advanced(by: .seconds(10)), events: &events)
        #expect(events.map(\.token) == [42])
        #expect(events.first?.readiness.contains(.readable) == true)
        events.removeAll()
        // Still readable, but not re-armed: not reported again.
        _ = backend.wait(until: .now.advanced(by: .milliseconds(20)), events: &events)
        #expect(events.isEmpty)
        try backend.arm(fds[0], for: .readable, token: 43)
        _ = backend.wait(until: .now.advanced(by: .seconds(10)), events: &events)
        #expect(events.map(\.token) == [43])
        backend.disarm(fds[0], token: 43)
    }

    /// An idle loop sleeps: over a second it makes a handful of waits, not a
    /// spin's worth, and uses almost no CPU.
    @Test(arguments: availableBackends)
    func idleLoopUsesNoCPU(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let keep = LoopSource { _ in }
            loop.add(keep)
            var before = timespec()
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &before)
            loop.run(mode: .default, timeout: .seconds(1))
            var after = timespec()
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &after)
            let cpuMicros = (after.tv_sec - before.tv_sec) * 1_000_000 + (after.tv_nsec - before.tv_nsec) / 1_000
            #expect(cpuMicros < 30_000, "an idle loop burned \(cpuMicros) µs of CPU in 1 s")
            #expect(loop.backend.statistics.waitSyscalls < 10)
            keep.invalidate()
        }
    }
}


@Suite("ThreadLoop memory")
struct ThreadLoopMemoryTests {
    /// Sources and timers added and removed over and over leave nothing
    /// behind: resident memory stays flat (within 4 MiB) across 200,000
    /// add/remove rounds after a warm-up. In a child process, so that no
    /// other test's allocations move the process's resident size.
    @Test func addRemoveDoesNotGrowMemory() async {
        await #expect(processExitsWith: .success) {
            for kind in availableBackends {
                let failed = UnsafeMutablePointer<Int>.allocate(capacity: 1)
                failed.initialize(to: 0)
                let box = SharedPointer(failed)
                onLoopThread(kind) { loop in
                    func rounds(_ n: Int) {
                        for i in 0..<n {
                            let source = LoopSource { _ in }
                            loop.add(source, forMode: i % 3 == 0 ? .common : .default)
                            let timer = LoopTimer(after: .seconds(60)) { _ in }
                            loop.add(timer, forMode: .default)
                            loop.remove(source, forMode: i % 3 == 0 ? .common : .default)
                            timer.invalidate()
                            if i % 1_000 == 0 { loop.run(mode: .default, timeout: .zero) }
                        }
                    }
                    rounds(20_000)
                    let before = residentBytes()
                    rounds(200_000)
                    let growth = residentBytes() - before
                    if growth >= 4 << 20 {
                        print("\(kind): resident memory grew \(growth) bytes over 200,000 add/remove rounds")
                        box.pointer.pointee = 1
                    }
                }
                if failed.pointee != 0 { exit(1) }
            }
            exit(0)
        }
    }
}
