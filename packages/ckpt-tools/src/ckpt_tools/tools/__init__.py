"""Whole-checkpoint operations: conversion, publishing, the model card."""
