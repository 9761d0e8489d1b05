from gpuctl.cli.app import main

main()
