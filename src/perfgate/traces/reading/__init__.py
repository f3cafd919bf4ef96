"""Reading profiles: the streaming Kineto reader, columnar event tables, the parse cache, windowed arrays, and the reports of system- and kernel-layer profilers."""
