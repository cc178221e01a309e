"""Kill a job's whole tree and know it dead: cgroup v2, or /proc scans."""
