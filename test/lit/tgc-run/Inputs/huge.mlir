// Too large to allocate. Not a .tg file: test_hl_differential.py runs every .tg under test/lit.
func.func @huge_argument(%x: tensor<1000000000x1000000000xf32>) -> tensor<1000000000x1000000000xf32> {
  func.return %x : tensor<1000000000x1000000000xf32>
}

func.func @huge_result(%x: tensor<1xf32>) -> tensor<1000000000x1000000000xf32> {
  %b = atomic.broadcast %x : (tensor<1xf32>) -> tensor<1000000000x1000000000xf32>
  %y = atomic.exp %b : (tensor<1000000000x1000000000xf32>) -> tensor<1000000000x1000000000xf32>
  func.return %y : tensor<1000000000x1000000000xf32>
}

func.func @unaddressable(%x: tensor<1xf32>) -> tensor<100000000000x100000000000xf32> {
  %y = atomic.broadcast %x : (tensor<1xf32>) -> tensor<100000000000x100000000000xf32>
  func.return %y : tensor<100000000000x100000000000xf32>
}
