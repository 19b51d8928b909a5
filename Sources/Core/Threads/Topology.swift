import CShims

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The machine as threads see it: which CPUs are online, how they group into
/// NUMA nodes, the cache line and page sizes, the stack sizes threads may
/// have; and memory placed on a chosen node, for data that should sit next to
/// the threads that use it.
///
/// Everything except `currentCPU` is read once per process, on first use (from
/// sysfs, with `sysconf` and libnuma as fallbacks), and never changes
/// afterwards: a CPU taken offline or brought online later is not seen. None
/// of the properties blocks after that first read.
///
/// On a machine (or in a container) without NUMA support, there is exactly
/// one node, 0, holding every online CPU; node 0 always works and any other
/// node is an error.
public enum Topology {
    /// A NUMA node: a group of CPUs and the memory closest to them.
    public struct NUMANode: Sendable, Hashable, CustomStringConvertible {
        /// The node's id, as the kernel numbers it (ids may have gaps).
        public let id: Int
        /// The online CPUs of the node, ascending. Empty for a node that has
        /// memory but no CPUs.
        public let cpus: [Int]

        /// `node 0: CPUs 0-3`.
        public var description: String { "node \(id): CPUs \(CPUList.format(cpus))" }
    }

    /// The ids of the online CPUs, ascending (`/sys/devices/system/cpu/online`;
    /// `0..<sysconf(_SC_NPROCESSORS_ONLN)` where sysfs is missing). Ids can
    /// have gaps when CPUs are offline.
    public static let onlineCPUs: [Int] = {
        if let text = ThreadCalls.readSmallFile("/sys/devices/system/cpu/online"),
           let ids = CPUList.parse(Substring(text)), !ids.isEmpty {
            return ids
        }
        return Array(0..<Int(cshims_cpu_count_online()))
    }()

    /// Whether the kernel reports NUMA support to libnuma. When it does not,
    /// `numaNodes` is a single node 0 and node placement has no effect.
    public static let isNUMAAvailable: Bool = cshims_numa_available() != 0

    /// The NUMA nodes, ascending by id, each with its online CPUs
    /// (`/sys/devices/system/node`).
    public static let numaNodes: [NUMANode] = {
        let online = onlineCPUs
        guard isNUMAAvailable else { return [NUMANode(id: 0, cpus: online)] }
        if let text = ThreadCalls.readSmallFile("/sys/devices/system/node/online"),
           let ids = CPUList.parse(Substring(text)), !ids.isEmpty {
            let onlineSet = Set(online)
            var nodes: [NUMANode] = []
            for id in ids {
                let list = ThreadCalls.readSmallFile("/sys/devices/system/node/node\(id)/cpulist") ?? ""
                let cpus = (CPUList.parse(Substring(list)) ?? []).filter { onlineSet.contains($0) }
                nodes.append(NUMANode(id: id, cpus: cpus))
            }
            return nodes
        }
        // No sysfs: ask libnuma which node each online CPU is on.
        var byNode: [Int: [Int]] = [0: []]
        for cpu in online {
            let node = Int(cshims_numa_node_of_cpu(Int32(cpu)))
            byNode[max(node, 0), default: []].append(cpu)
        }
        return byNode.keys.sorted().map { NUMANode(id: $0, cpus: byNode[$0]!) }
    }()

    /// The ids of the NUMA nodes, ascending.
    public static var numaNodeIDs: [Int] { numaNodes.map(\.id) }

    /// The L1 data cache line in bytes (`sysconf(_SC_LEVEL1_DCACHE_LINESIZE)`,
    /// then sysfs; 64 if neither answers). To keep two hot words from
    /// sharing a line, separate them by twice this on x86_64: its adjacent-line
    /// prefetcher pulls lines in pairs.
    public static let cacheLineSize: Int = {
        let size = Int(cshims_cache_line_size())
        return size > 0 ? size : 64
    }()

    /// The page size in bytes (`sysconf(_SC_PAGESIZE)`). Stack sizes are
    /// whole pages.
    public static let pageSize: Int = Int(cshims_page_size())

    /// The smallest stack a `NativeThread` may be given, in bytes: the larger
    /// of `sysconf(_SC_THREAD_STACK_MIN)` (16 KiB on x86_64 and AArch64
    /// glibc) and `spindleStackNeed`, rounded up to whole pages. glibc's
    /// minimum only covers glibc: a thread given it crashes in Spindle's own
    /// entry and exit path (see `spindleStackNeed`).
    public static let minimumStackSize: Int = {
        let need = max(Int(cshims_thread_stack_min()), spindleStackNeed)
        return (need + pageSize - 1) / pageSize * pageSize
    }()

    /// What Spindle's own thread entry and exit path, with a small body,
    /// needs of a thread's stack size. Measured (x86_64, debug build, a body
    /// that allocates, locks, sets a thread-local and the thread dictionary,
    /// then the thread's exit duties destroying them): the deepest use was
    /// 22.3 KB of the requested size (glibc's descriptor and static TLS
    /// included) on the first thread of a process to exit, 9.1 KB on later
    /// ones (release build: 17.5 KB and 6.1 KB); 16 and 20 KiB stacks
    /// crashed with SIGSEGV there, 24 KiB was the smallest that ran. 32 KiB
    /// keeps a margin for a larger static TLS in other programs.
    static var spindleStackNeed: Int { 32 * 1024 }

    /// The stack a thread gets when none is asked for, in bytes: glibc takes
    /// it from `RLIMIT_STACK` at startup (8 MiB by default). It is address
    /// space reserved, not memory used: only touched pages become resident.
    public static let defaultStackSize: Int = {
        let size = cshims_thread_default_stack_size()
        return size > 0 ? Int(size) : 8 << 20
    }()

    /// The CPU the calling thread is running on at this instant
    /// (`sched_getcpu`, served by the vDSO); it may move right after. `nil`
    /// where the kernel cannot say.
    public static var currentCPU: Int? {
        let cpu = cshims_current_cpu()
        return cpu >= 0 ? Int(cpu) : nil
    }

    /// The NUMA node of an online CPU. Throws `cpuOutOfRange` for any other id.
    public static func node(ofCPU cpu: Int) throws(NativeThreadError) -> Int {
        _ = try checkCPUs([cpu])
        for node in numaNodes where node.cpus.contains(cpu) { return node.id }
        return 0
    }

    // MARK: Node-local memory

    /// Allocates `byteCount` bytes (rounded up to whole pages) of zeroed
    /// memory bound to NUMA node `node` (`numa_alloc_onnode(3)`; a plain
    /// anonymous `mmap` where there is no NUMA support). Pages are bound
    /// when first touched, so touch them from a thread on that node.
    ///
    /// Free it with `deallocate(_:)`, passing the buffer returned here
    /// unchanged. Page-aligned. Does not block beyond the `mmap`.
    ///
    /// Throws `numaNodeOutOfRange` for a node that does not exist, and
    /// `systemCall` (ENOMEM) when the memory is not there. A `byteCount` of 0
    /// or less is a programming error and stops the process.
    public static func allocate(byteCount: Int, onNode node: Int) throws(NativeThreadError) -> UnsafeMutableRawBufferPointer {
        require(byteCount > 0, "Topology.allocate(byteCount:onNode:): `byteCount` is \(byteCount); allocate at least one byte")
        _ = try checkNode(node)
        let memory = try ThreadCalls.allocate(byteCount: byteCount, onNode: Int32(node))
        return UnsafeMutableRawBufferPointer(start: memory, count: byteCount)
    }

    /// Frees memory from `allocate(byteCount:onNode:)` (`numa_free(3)`).
    /// Passing anything else, or a buffer whose count was changed, unmaps the
    /// wrong range: undefined behaviour, like freeing a pointer twice.
    public static func deallocate(_ memory: UnsafeMutableRawBufferPointer) {
        guard let base = memory.baseAddress else { return }
        cshims_numa_free(base, memory.count)
    }

    // MARK: Validation shared with NativeThread

    /// Checks that every id is an online CPU; returns them ascending.
    static func checkCPUs(_ cpus: Set<Int>) throws(NativeThreadError) -> [Int] {
        let sorted = cpus.sorted()
        guard !sorted.isEmpty else { throw .emptyCPUSet }
        let online = onlineCPUs
        for cpu in sorted where !binaryContains(online, cpu) {
            throw .cpuOutOfRange(cpu: cpu, online: online)
        }
        return sorted
    }

    /// Checks that a node exists; returns it.
    static func checkNode(_ id: Int) throws(NativeThreadError) -> NUMANode {
        guard let node = numaNodes.first(where: { $0.id == id }) else {
            throw .numaNodeOutOfRange(node: id, available: numaNodeIDs)
        }
        return node
    }

    /// The kernel's CPU mask for `cpus`: bit c of word c / 64. At least 16
    /// words (glibc's 1024-bit `cpu_set_t`).
    static func mask(of cpus: [Int]) -> [UInt64] {
        let words = max(16, ((cpus.max() ?? 0) + 64) / 64)
        var mask = [UInt64](repeating: 0, count: words)
        for cpu in cpus { mask[cpu / 64] |= 1 << UInt64(cpu % 64) }
        return mask
    }

    private static func binaryContains(_ sorted: [Int], _ value: Int) -> Bool {
        var low = 0
        var high = sorted.count
        while low < high {
            let mid = (low + high) / 2
            if sorted[mid] < value { low = mid + 1 } else { high = mid }
        }
        return low < sorted.count && sorted[low] == value
    }
}
