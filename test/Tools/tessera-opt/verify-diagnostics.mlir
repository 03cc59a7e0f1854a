// RUN: tessera-opt %s -split-input-file -verify-diagnostics
// RUN: not tessera-opt %s -split-input-file 2>&1 | FileCheck %s

// Every way to say where an expected diagnostic is: on the line itself,
// @+N, @-N, @above and @below; notes are checked too.

// CHECK: verify-diagnostics.mlir:[[# @LINE + 2]]:8: error: 'tgraph.matmul' op contraction dimensions differ
func.func @same_line(%a: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = tgraph.matmul %a, %a : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32> // expected-error {{contraction dimensions differ}}
  return %0 : tensor<8x16xf32>
}

// -----

func.func @plus(%a: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // expected-error @+2 {{contraction dimensions differ}}
  // A comment in between.
  %0 = tgraph.matmul %a, %a : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

func.func @minus(%a: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = tgraph.matmul %a, %a : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  // expected-error @-1 {{contraction dimensions differ}}
  return %0 : tensor<8x16xf32>
}

// -----

func.func @above(%a: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = tgraph.matmul %a, %a : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  // expected-error @above {{contraction dimensions differ}}
  return %0 : tensor<8x16xf32>
}

// -----

func.func @below(%a: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // expected-error @below {{contraction dimensions differ}}
  %0 = tgraph.matmul %a, %a : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

// Notes are diagnostics of their own.
// expected-note @below {{see existing symbol definition here}}
func.func @twice() {
  return
}
// expected-error @below {{redefinition of symbol named 'twice'}}
func.func @twice() {
  return
}

// -----

// Regular expressions: expected-error-re with {{...}} parts.
func.func @regex(%a: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // expected-error-re @below {{contraction dimensions differ: 'lhs' has shape {{[0-9]+}}x16 (K = {{[0-9]+}})}}
  %0 = tgraph.matmul %a, %a : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

// A parse error, expected like any other.
func.func @parse_error() {
  // expected-error @below {{expected SSA operand}}
  %0 = arith.addi : i32
  return
}
