raise RuntimeError("this app is broken at import time")
