import CShims

#if canImport(Glibc)
import Glibc
#endif

extension Topology {
    /// How many CPUs this process can keep busy at once: the CPUs in the
    /// calling thread's affinity mask (`sched_getaffinity(2)`, which the
    /// kernel already narrows to the cgroup's `cpuset.cpus.effective`), cut
    /// to the tightest cgroup v2 CPU quota on the path from the process's
    /// cgroup to the root (`cpu.max`: quota ÷ period, rounded up), at least 1.
    /// Read once, the first time it is asked for: a process moved to another
    /// cgroup later keeps the first answer. Spindle's worker pool starts this
    /// many workers per priority band.
    public static let availableCPUCount: Int = {
        let mask = (try? ThreadCalls.affinity(of: getpid()).count) ?? onlineCPUs.count
        let quota = cgroupCPUQuota() ?? Int.max
        return max(1, min(mask, quota, onlineCPUs.count))
    }()

    /// The tightest `cpu.max` quota (in whole CPUs, rounded up) of the
    /// process's cgroup v2 and its ancestors, or nil when none is set or
    /// cgroup v2 is not mounted at `/sys/fs/cgroup`.
    static func cgroupCPUQuota() -> Int? {
        guard let membership = ThreadCalls.readSmallFile("/proc/self/cgroup") else { return nil }
        // cgroup v2 has one line, "0::/path".
        guard let line = membership.split(separator: "\n").first(where: { $0.hasPrefix("0::") }) else {
            return nil
        }
        var path = String(line.dropFirst(3))
        var tightest: Int?
        while true {
            let file = "/sys/fs/cgroup" + (path == "/" ? "" : path) + "/cpu.max"
            if let text = ThreadCalls.readSmallFile(file), let cpus = cpuCount(fromCPUMax: text) {
                tightest = min(tightest ?? cpus, cpus)
            }
            if path == "/" || path.isEmpty { break }
            if let slash = path.lastIndex(of: "/") {
                path = slash == path.startIndex ? "/" : String(path[..<slash])
            } else {
                break
            }
        }
        return tightest
    }

    /// "max 100000" is no quota; "150000 100000" is 1.5 CPUs, rounded up to 2.
    package static func cpuCount(fromCPUMax text: String) -> Int? {
        let fields = text.split(whereSeparator: { $0 == " " || $0 == "\n" })
        guard fields.count >= 2, let quota = Int(fields[0]), let period = Int(fields[1]), period > 0, quota > 0
        else { return nil }
        return (quota + period - 1) / period
    }
}
