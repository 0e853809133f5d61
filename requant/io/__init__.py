"""Files in and out: the strict safetensors reader (safetensors_io), bounded reads of user files
(inputs), symlink and path checks (links), atomic outputs (output)."""
