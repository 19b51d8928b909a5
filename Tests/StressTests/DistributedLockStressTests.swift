import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

@Suite("DistributedLock torture")
struct DistributedLockStressTests {
    /// 8 processes × 1,000 tryLock/unlock cycles on one path (the issue's
    /// count; 20,000 at full size). In each critical
    /// section a process appends "<pid> in" and "<pid> out" to a log; if two
    /// sections ever overlapped, the log would show an "in" followed by
    /// another process's line.
    @Test func eightProcessesNeverOverlap() async throws {
        // Read again in each child, from the same inherited environment.
        let cycles = stressSize(ci: 1_000, full: 20_000)
        let base = "/tmp/spindle-torture-\(getpid())"
        unlink(base + ".lock")
        unlink(base + ".log")
        defer { unlink(base + ".lock"); unlink(base + ".log") }
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    await #expect(processExitsWith: .success) {
                        let base = "/tmp/spindle-torture-\(getppid())"
                        let lock = DistributedLock(path: base + ".lock")
                        let log = open(base + ".log", O_WRONLY | O_CREAT | O_APPEND, 0o644)
                        guard log >= 0 else { exit(3) }
                        let pid = getpid()
                        var done = 0
                        let cycles = stressSize(ci: 1_000, full: 20_000)
                        while done < cycles {
                            guard (try? lock.tryLock()) == true else {
                                sched_yield()
                                continue
                            }
                            for word in ["in", "out"] {
                                let line = "\(pid) \(word)\n"
                                _ = line.withCString { write(log, $0, strlen($0)) }
                            }
                            guard (try? lock.unlock()) != nil else { exit(4) }
                            done += 1
                        }
                        close(log)
                        exit(0)
                    }
                }
            }
        }
        let fd = open(base + ".log", O_RDONLY)
        #expect(fd >= 0)
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let n = read(fd, &chunk, chunk.count)
            if n <= 0 { break }
            bytes += chunk[0..<n]
        }
        close(fd)
        let lines = String(decoding: bytes, as: UTF8.self).split(separator: "\n")
        #expect(lines.count == 8 * cycles * 2)
        var overlaps = 0
        var pids = Set<Substring>()
        for i in stride(from: 0, to: lines.count - 1, by: 2) {
            let a = lines[i].split(separator: " "), b = lines[i + 1].split(separator: " ")
            if a.count != 2 || b.count != 2 || a[1] != "in" || b[1] != "out" || a[0] != b[0] { overlaps += 1 }
            pids.insert(a[0])
        }
        #expect(overlaps == 0, "critical sections overlapped \(overlaps) times")
        #expect(pids.count == 8)
        // Each pair of log lines (one critical section) checked for overlap.
        StressReport.record(operations: 8 * cycles, threads: 8, checks: lines.count / 2)
    }
}
