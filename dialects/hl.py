"""The `hl` dialect: the high-level ops people write. (Being filled in.)"""
