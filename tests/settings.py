"""Configuration fields the tests share: a ZPPOConfig that trains on this machine's CPU and reports nowhere
(``CPU``), and a teacher address that nothing listens on (``UNREACHABLE_TEACHER``: for rows whose configuration needs
a teacher where the test never asks it anything)."""

CPU = dict(output_dir="unused", use_cpu=True, bf16=False, report_to=[])
UNREACHABLE_TEACHER = dict(teacher_base_url="http://127.0.0.1:1/v1", teacher_model="t")
