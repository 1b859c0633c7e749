"""Every dataset train.py knows: name -> (module with prepare(), kind of data). Filled in as datasets land."""
